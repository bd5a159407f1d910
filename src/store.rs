//! Object storage for drained read-back paths: the store from a URL, the key layout, the
//! constant-memory archive upload and the manifest that commits it (ADR-143 §3, §5).
//!
//! Supported URLs: `file:///abs/dir` (created if missing), `memory://` (tests), `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix`. Options are validated against a per-scheme
//! allow-list (object_store's own parser silently ignores unknown keys, which turns a typo in
//! `secret_acess_key` into an anonymous client). Cloud credentials also come from the environment
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`) through the builders' `from_env`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::buffered::BufWriter;
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
};
use serde::{Deserialize, Serialize};

use crate::api::{Compression, ReadBackPhase};

pub mod open_uploads;
pub mod purge;
use crate::drain::archive::{
    DrainOptions, DrainOutcome, DroppedRecord, MemberRecord, RejectedRecord,
};

/// Version of the manifest layout; bumped on any incompatible change.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;
/// Suffix of manifest objects.
pub const MANIFEST_SUFFIX: &str = ".manifest.json";
/// Smallest multipart part S3 accepts (all but the last part).
pub const MIN_PART_BYTES: u64 = 5 * 1024 * 1024;
/// Most parts of one S3 multipart upload.
pub const MAX_PARTS: u64 = 10_000;
/// Parts uploaded concurrently: each in flight holds one part in memory (CRATES.md: the BufWriter
/// default of 8 would be 8 parts).
pub const UPLOAD_CONCURRENCY: usize = 2;
/// Longest path slug in a key.
pub const MAX_SLUG_BYTES: usize = 64;

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
        crate::store_credentials::credential_settings(scheme)
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

/// A store URL and its options, as configured. Its `Debug` redacts credential values, so it can be
/// logged.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    url: String,
    options: Vec<(String, String)>,
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options: Vec<(&str, &str)> = self
            .options
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    if is_secret_key(k) {
                        "<redacted>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        f.debug_struct("StoreConfig")
            .field("url", &redact_url(&self.url))
            .field("options", &options)
            .finish()
    }
}

/// Whether an option's value must never be logged.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["secret", "token", "key", "password", "sas", "credential"]
        .iter()
        .any(|s| key.contains(s))
        && key != "access_key_id"
}

/// The URL with any userinfo replaced.
fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("redacted");
            let _ = u.set_password(None);
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "<unparsable url>".into(),
    }
}

const CLIENT_KEYS: &[&str] = &[
    "allow_http",
    "allow_invalid_certificates",
    "timeout",
    "connect_timeout",
    "proxy_url",
];
const S3_KEYS: &[&str] = &[
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "virtual_hosted_style_request",
    "skip_signature",
    "conditional_put",
    "checksum_algorithm",
    "unsigned_payload",
    "imdsv1_fallback",
];
const GCS_KEYS: &[&str] = &[
    "service_account",
    "service_account_key",
    "application_credentials",
];
const AZURE_KEYS: &[&str] = &[
    "account_name",
    "access_key",
    "sas_key",
    "client_id",
    "client_secret",
    "tenant_id",
    "use_emulator",
    "endpoint",
];

/// The accepted option keys of a scheme.
fn allowed_keys(scheme: &str) -> Vec<&'static str> {
    match scheme {
        "s3" => S3_KEYS.iter().chain(CLIENT_KEYS).copied().collect(),
        "gs" => GCS_KEYS.iter().chain(CLIENT_KEYS).copied().collect(),
        "az" => AZURE_KEYS.iter().chain(CLIENT_KEYS).copied().collect(),
        _ => Vec::new(),
    }
}

/// Retries of transient errors (5xx, timeouts, connection resets) with exponential backoff. The
/// total is kept under the drain timeout's usual range; a multipart part is retried whole.
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 8,
        retry_timeout: Duration::from_secs(120),
    }
}

impl StoreConfig {
    /// Validates the URL's scheme and the option keys (values are checked by the builders).
    pub fn new(url: &str, options: &[(String, String)]) -> Result<Self, StoreError> {
        let parsed = url::Url::parse(url).map_err(|e| StoreError::InvalidUrl {
            url: redact_url(url),
            reason: e.to_string(),
        })?;
        let scheme = parsed.scheme();
        if !matches!(scheme, "file" | "memory" | "s3" | "gs" | "az") {
            return Err(StoreError::UnsupportedScheme {
                scheme: scheme.into(),
            });
        }
        let allowed = allowed_keys(scheme);
        for (key, _) in options {
            if !allowed.contains(&key.as_str()) {
                return Err(StoreError::UnknownOption {
                    scheme: scheme.into(),
                    key: key.clone(),
                    allowed: if allowed.is_empty() {
                        "none".into()
                    } else {
                        allowed.join(", ")
                    },
                });
            }
        }
        Ok(StoreConfig {
            url: url.into(),
            options: options.to_vec(),
        })
    }

    /// The S3 client settings this configuration names: the environment, then the URL's bucket,
    /// then the options. The store and the clean-up of open multipart uploads
    /// (`open_uploads`) both start from it, so they sign with the same credentials and talk to
    /// the same endpoint.
    pub fn s3_builder(&self) -> Result<AmazonS3Builder, StoreError> {
        let invalid = |reason: &str| StoreError::InvalidUrl {
            url: redact_url(&self.url),
            reason: reason.into(),
        };
        let url = url::Url::parse(&self.url).map_err(|e| invalid(&e.to_string()))?;
        let bucket = match url.host_str() {
            Some(h) if url.scheme() == "s3" && !h.is_empty() => format!("s3://{h}"),
            _ => {
                return Err(invalid(
                    "a bucket (or container) is required: <scheme>://<bucket>/<prefix>",
                ))
            }
        };
        let mut b = AmazonS3Builder::from_env().with_url(bucket);
        for (k, v) in &self.options {
            let key = AmazonS3ConfigKey::from_str(k).map_err(|source| StoreError::Build {
                scheme: "s3".into(),
                source,
            })?;
            b = b.with_config(key, v);
        }
        Ok(b)
    }

    /// Builds the store and returns it with the key prefix the URL names.
    pub fn build(&self) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
        let invalid = |reason: &str| StoreError::InvalidUrl {
            url: redact_url(&self.url),
            reason: reason.into(),
        };
        let url = url::Url::parse(&self.url).map_err(|e| invalid(&e.to_string()))?;
        let scheme = url.scheme().to_string();
        let prefix =
            Path::parse(url.path().trim_matches('/')).map_err(|e| invalid(&e.to_string()))?;
        let build_err = |source| StoreError::Build {
            scheme: scheme.clone(),
            source,
        };
        let bucket = || match url.host_str() {
            Some(h) if !h.is_empty() => Ok(format!("{scheme}://{h}")),
            _ => Err(invalid(
                "a bucket (or container) is required: <scheme>://<bucket>/<prefix>",
            )),
        };
        let store: Arc<dyn ObjectStore> = match scheme.as_str() {
            "memory" => Arc::new(InMemory::new()),
            "file" => {
                let dir = url.to_file_path().map_err(|()| {
                    invalid("a file URL needs an absolute local path: file:///abs/dir")
                })?;
                std::fs::create_dir_all(&dir).map_err(|source| StoreError::CreateDir {
                    path: dir.display().to_string(),
                    source,
                })?;
                let fs = LocalFileSystem::new_with_prefix(&dir).map_err(build_err)?;
                // The prefix is the directory itself.
                return Ok((Arc::new(fs), Path::default()));
            }
            "s3" => Arc::new(
                self.s3_builder()?
                    .with_retry(retry_config())
                    .build()
                    .map_err(build_err)?,
            ),
            "gs" => {
                let mut b = GoogleCloudStorageBuilder::from_env()
                    .with_url(bucket()?)
                    .with_retry(retry_config());
                for (k, v) in &self.options {
                    let key = GoogleConfigKey::from_str(k).map_err(build_err)?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(build_err)?)
            }
            "az" => {
                let mut b = MicrosoftAzureBuilder::from_env()
                    .with_url(bucket()?)
                    .with_retry(retry_config());
                for (k, v) in &self.options {
                    let key = AzureConfigKey::from_str(k).map_err(build_err)?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(build_err)?)
            }
            other => {
                return Err(StoreError::UnsupportedScheme {
                    scheme: other.into(),
                })
            }
        };
        tracing::debug!(config = ?self, %prefix, "object store configured");
        Ok((store, prefix))
    }
}

/// The store a URL names, and the key prefix under which runs are stored. See [`StoreConfig`].
pub fn store_from_url(
    url: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    StoreConfig::new(url, options)?.build()
}

/// The run a drained path belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    /// Namespace of the SandboxRun.
    pub namespace: String,
    /// Name of the SandboxRun.
    pub name: String,
    /// UID of the SandboxRun (a re-created run with the same name does not collide).
    pub uid: String,
}

/// Where one declared path's archive and manifest live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKeys {
    /// The archive: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.<ext>`.
    pub archive: Path,
    /// The manifest: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.manifest.json`.
    pub manifest: Path,
}

/// The keys of the `index`-th declared path of a run.
///
/// Layout: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.<ext>` for the archive (`ext` is
/// `tar`, `tar.gz` or `tar.zst`) and `<…>/<index>-<slug>.manifest.json` for its manifest, where
/// `index` is the path's position in `spec.readBack.paths`, zero-padded to 2 digits (it keeps two
/// paths with the same slug apart) and `slug` is [`path_slug`]. The manifest key carries no
/// compression extension on purpose: a reader finds the commit point from the run and the path
/// alone, and the manifest names the archive key.
pub fn object_keys(
    prefix: &Path,
    run: &RunRef,
    index: usize,
    declared_path: &str,
    compression: Compression,
) -> ObjectKeys {
    let dir = run_dir(prefix, run);
    let stem = format!("{index:02}-{}", path_slug(declared_path));
    ObjectKeys {
        archive: dir
            .clone()
            .join(format!("{stem}.{}", compression.extension()).as_str()),
        manifest: dir.join(format!("{stem}{MANIFEST_SUFFIX}").as_str()),
    }
}

/// `<prefix>/<namespace>/<name>/<uid>`: the directory of every key [`object_keys`] names for one
/// run (this uid only), and the only prefix `readBack.retention: Delete` deletes under.
pub fn run_dir(prefix: &Path, run: &RunRef) -> Path {
    run_prefix(prefix, &run.namespace, &run.name).join(run.uid.as_str())
}

/// `<prefix>/<namespace>/<name>`: everything stored for a run name, all uids.
pub fn run_prefix(prefix: &Path, namespace: &str, name: &str) -> Path {
    prefix.clone().join(namespace).join(name)
}

/// A safe ASCII rendering of a declared path for object keys: `/work/out` → `work-out`. Keeps
/// `[A-Za-z0-9_]`, turns every other run of bytes into one `-`, trims `-` at both ends, bounds the
/// length to [`MAX_SLUG_BYTES`], and is never empty (`path` when nothing is left).
pub fn path_slug(declared: &str) -> String {
    let mut slug = String::with_capacity(declared.len().min(MAX_SLUG_BYTES));
    for c in declared.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
        if slug.len() >= MAX_SLUG_BYTES {
            break;
        }
    }
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        "path".into()
    } else {
        slug.into()
    }
}

/// Part size of the multipart upload: large enough that the biggest archive the drain can emit
/// fits in [`MAX_PARTS`] parts, never below [`MIN_PART_BYTES`], rounded up to a MiB.
pub fn part_size(opts: &DrainOptions) -> usize {
    // The re-emitted archive is a subset of the input plus our own headers (never more than the
    // input's own headers for the same members), so the input bound bounds it; keep 5% margin.
    let bound = opts
        .max_input_bytes
        .saturating_add(opts.max_input_bytes / 20);
    let per_part = bound.div_ceil(MAX_PARTS).max(MIN_PART_BYTES);
    let mib = 1024 * 1024;
    usize::try_from(per_part.div_ceil(mib) * mib).unwrap_or(usize::MAX)
}

/// A constant-memory writer for an archive: at most `UPLOAD_CONCURRENCY + 1` parts of
/// [`part_size`] in memory. Small archives go up as one PUT on shutdown; larger ones as a multipart
/// upload that `abort()` cleans up on failure, and that aborts itself when the writer is dropped
/// unfinished (a cancelled attempt: see [`crate::upload_guard`]).
pub fn archive_writer(
    store: Arc<dyn ObjectStore>,
    key: Path,
    opts: &DrainOptions,
) -> ArchiveWriter {
    let store: Arc<dyn ObjectStore> = Arc::new(crate::upload_guard::AbortingStore::new(store));
    ArchiveWriter {
        inner: BufWriter::with_capacity(store, key, part_size(opts))
            .with_max_concurrency(UPLOAD_CONCURRENCY),
        shutdown_started: false,
    }
}

/// The archive upload: object_store's [`BufWriter`], plus the one thing it does not tell its
/// caller: whether shutdown (the final PUT or the multipart completion) has begun. `BufWriter::abort`
/// PANICS once shutdown was called ("Already shut down"), and a drain fails in shutdown exactly
/// when the store is unreachable at the end of the stream — a panic that took the whole operator
/// down. Here `abort` after a started shutdown is a no-op: the upload's future owned the
/// multipart state and dropped it, so there is nothing left this writer could abort.
pub struct ArchiveWriter {
    inner: BufWriter,
    shutdown_started: bool,
}

impl ArchiveWriter {
    /// Aborts the upload, cleaning up uploaded parts; a no-op once shutdown has begun.
    pub async fn abort(&mut self) -> object_store::Result<()> {
        if self.shutdown_started {
            return Ok(());
        }
        self.inner.abort().await
    }
}

impl tokio::io::AsyncWrite for ArchiveWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.shutdown_started = true;
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the drain caller knows about the path being drained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestContext {
    /// The run.
    pub run: RunRef,
    /// The declared container path.
    pub declared_path: String,
    /// Its position in `spec.readBack.paths`.
    pub index: usize,
    /// Drain attempt number (1-based).
    pub attempt: u32,
}

/// Totals of a drained path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Members stored.
    pub members: u64,
    /// Content bytes stored.
    pub bytes: u64,
    /// Files dropped by the cap.
    pub dropped_members: u64,
    /// Their content bytes.
    pub dropped_bytes: u64,
    /// Entries rejected by the sanitizer.
    pub rejected_members: u64,
    /// Bytes read from the pod.
    pub input_bytes: u64,
    /// Bytes of the stored archive.
    pub archive_bytes: u64,
}

/// The commit point of one drained path: present means the archive is complete (DESIGN "Object
/// layout"). Lists every member and every dropped or rejected entry with its reason, so a reader
/// can tell a failed drain from an empty one (ADR-143 §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`MANIFEST_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The run.
    pub run: RunRef,
    /// The declared container path.
    pub declared_path: String,
    /// Its position in `spec.readBack.paths`.
    pub index: usize,
    /// Key of the archive this manifest commits.
    pub archive_key: String,
    /// Compression of the archive.
    pub compression: Compression,
    /// The cap the drain metered against.
    pub cap_bytes: u64,
    /// Drain attempt that committed.
    pub attempt: u32,
    /// When the committing attempt started (RFC 3339).
    pub started_at: String,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// Drained, Empty or Capped.
    pub phase: ReadBackPhase,
    /// Totals.
    pub totals: Totals,
    /// Stored members, in archive order.
    pub members: Vec<MemberRecord>,
    /// Files dropped by the cap: by the drain's meter, or by the packer in the pod (`inPod`, only
    /// a placeholder crossed the wire), or because the stream reached the input bound.
    pub dropped: Vec<DroppedRecord>,
    /// Entries rejected by the sanitizer, with reasons.
    pub rejected: Vec<RejectedRecord>,
    /// Set (to the bound, in bytes) when the drain stopped reading the stream at its input bound:
    /// the members listed are the ones read before that point, the rest was never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_input_bound: Option<u64>,
    /// What the packer in the pod reported on stderr: files it could not read, special files it
    /// skipped, files that changed size while read. Never silent (DESIGN: "an unreadable file is
    /// recorded as such, never silently skipped").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_notes: Vec<String>,
}

impl Manifest {
    /// The manifest of a successful drain.
    pub fn new(
        ctx: &ManifestContext,
        keys: &ObjectKeys,
        opts: &DrainOptions,
        outcome: &DrainOutcome,
        started: jiff::Timestamp,
        finished: jiff::Timestamp,
    ) -> Self {
        Self::from_outcome(ctx, keys, opts, outcome.clone(), started, finished)
    }

    /// [`Manifest::new`], taking the outcome's records instead of copying them (a drain's records
    /// may be tens of MiB: docs/contract.md, "Unbounded size").
    pub fn from_outcome(
        ctx: &ManifestContext,
        keys: &ObjectKeys,
        opts: &DrainOptions,
        outcome: DrainOutcome,
        started: jiff::Timestamp,
        finished: jiff::Timestamp,
    ) -> Self {
        Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            run: ctx.run.clone(),
            declared_path: ctx.declared_path.clone(),
            index: ctx.index,
            archive_key: keys.archive.to_string(),
            compression: opts.compression,
            cap_bytes: opts.cap_bytes,
            attempt: ctx.attempt,
            started_at: started.to_string(),
            finished_at: finished.to_string(),
            phase: outcome.phase(),
            totals: Totals {
                members: outcome.members.len() as u64,
                bytes: outcome.bytes,
                // Listed or not (docs/contract.md: past a bound, records are only counted).
                dropped_members: outcome.dropped_count(),
                // Saturating: a dropped size may be the pod's (forged) word.
                dropped_bytes: outcome.dropped_bytes(),
                rejected_members: outcome.rejected_count(),
                input_bytes: outcome.input_bytes,
                archive_bytes: outcome.archive_bytes,
            },
            members: outcome.members,
            dropped: outcome.dropped,
            rejected: outcome.rejected,
            stopped_at_input_bound: outcome.stopped_at_input_bound,
            pod_notes: Vec::new(),
        }
    }

    /// The drain outcome this manifest records.
    pub fn outcome(&self) -> DrainOutcome {
        DrainOutcome {
            members: self.members.clone(),
            dropped: self.dropped.clone(),
            rejected: self.rejected.clone(),
            bytes: self.totals.bytes,
            input_bytes: self.totals.input_bytes,
            archive_bytes: self.totals.archive_bytes,
            stopped_at_input_bound: self.stopped_at_input_bound,
            unlisted_dropped: self
                .totals
                .dropped_members
                .saturating_sub(self.dropped.len() as u64),
            unlisted_dropped_bytes: self.totals.dropped_bytes.saturating_sub(
                self.dropped
                    .iter()
                    .fold(0u64, |sum, d| sum.saturating_add(d.size)),
            ),
            unlisted_rejected: self
                .totals
                .rejected_members
                .saturating_sub(self.rejected.len() as u64),
        }
    }

    /// Whether two manifests describe the same stored content (timestamps and attempt aside).
    pub fn same_content(&self, other: &Manifest) -> bool {
        self.archive_key == other.archive_key
            && self.compression == other.compression
            && self.members == other.members
            && self.dropped == other.dropped
            && self.rejected == other.rejected
            && self.stopped_at_input_bound == other.stopped_at_input_bound
    }
}

/// Result of a create-only manifest write.
#[derive(Debug, PartialEq, Eq)]
pub enum ManifestWrite {
    /// This call committed the path.
    Created,
    /// A manifest was already there (an earlier attempt committed); here it is.
    AlreadyCommitted(Box<Manifest>),
}

/// The manifest's JSON, allocated once at its exact size: a manifest may list tens of MiB of
/// records (docs/contract.md, "Unbounded size"), and a buffer grown by doubling would hold up to
/// three times that at once.
fn manifest_json(manifest: &Manifest) -> serde_json::Result<Vec<u8>> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer_pretty(&mut count, manifest)?;
    let mut json = Vec::with_capacity(count.0);
    serde_json::to_writer_pretty(&mut json, manifest)?;
    Ok(json)
}

/// Writes a manifest create-only: the first complete attempt commits, later ones read it back.
pub async fn write_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    manifest: &Manifest,
) -> Result<ManifestWrite, StoreError> {
    let json = manifest_json(manifest).map_err(|source| StoreError::ManifestJson {
        key: key.to_string(),
        source,
    })?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match store.put_opts(key, PutPayload::from(json), opts).await {
        Ok(_) => Ok(ManifestWrite::Created),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {
            tracing::info!(manifest = %key, "manifest already committed by an earlier attempt");
            Ok(ManifestWrite::AlreadyCommitted(Box::new(
                read_manifest(store, key).await?,
            )))
        }
        Err(source) => Err(StoreError::Object {
            op: "writing manifest",
            key: key.to_string(),
            source,
        }),
    }
}

/// Reads a manifest.
pub async fn read_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Manifest, StoreError> {
    let bytes = match store.get(key).await {
        Ok(got) => got.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = bytes.map_err(|source| match source {
        object_store::Error::NotFound { .. } => StoreError::NotFound {
            key: key.to_string(),
        },
        source => StoreError::Object {
            op: "reading manifest",
            key: key.to_string(),
            source,
        },
    })?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::ManifestJson {
        key: key.to_string(),
        source,
    })
}

/// Reads a manifest if there is one.
pub async fn try_read_manifest(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Option<Manifest>, StoreError> {
    match read_manifest(store, key).await {
        Ok(m) => Ok(Some(m)),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every manifest stored for a run name (all uids, all paths), sorted by key: what `files ls`
/// shows and `files get` picks from.
pub async fn list_manifests(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    namespace: &str,
    name: &str,
) -> Result<Vec<(Path, Manifest)>, StoreError> {
    let dir = run_prefix(prefix, namespace, name);
    let metas: Vec<_> = store
        .list(Some(&dir))
        .try_collect()
        .await
        .map_err(|source| StoreError::Object {
            op: "listing",
            key: dir.to_string(),
            source,
        })?;
    let mut keys: Vec<Path> = metas
        .into_iter()
        .map(|m| m.location)
        .filter(|p| p.filename().is_some_and(|f| f.ends_with(MANIFEST_SUFFIX)))
        .collect();
    keys.sort();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let manifest = read_manifest(store, &key).await?;
        out.push((key, manifest));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run() -> RunRef {
        RunRef {
            namespace: "ns".into(),
            name: "job".into(),
            uid: "1234-abcd".into(),
        }
    }

    #[test]
    fn slug_is_safe_ascii_bounded_and_never_empty() {
        assert_eq!(path_slug("/work/out"), "work-out");
        assert_eq!(path_slug("/a//b.c/Ü-x_y"), "a-b-c-x_y");
        assert_eq!(path_slug("/"), "path");
        assert_eq!(path_slug("/ü/é"), "path");
        let long = format!("/{}", "x".repeat(500));
        assert_eq!(path_slug(&long).len(), MAX_SLUG_BYTES);
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let keys = object_keys(
            &Path::from("drains"),
            &run(),
            3,
            "/work/out",
            Compression::Zstd,
        );
        assert_eq!(
            keys.archive.as_ref(),
            "drains/ns/job/1234-abcd/03-work-out.tar.zst"
        );
        assert_eq!(
            keys.manifest.as_ref(),
            "drains/ns/job/1234-abcd/03-work-out.manifest.json"
        );
        let root = object_keys(&Path::default(), &run(), 0, "/out", Compression::None);
        assert_eq!(root.archive.as_ref(), "ns/job/1234-abcd/00-out.tar");
    }

    #[test]
    fn part_size_fits_the_largest_archive_in_ten_thousand_parts() {
        let small = DrainOptions::new(1024, Compression::None);
        assert_eq!(part_size(&small) as u64, MIN_PART_BYTES);
        let big = DrainOptions::new(16 * crate::config::GIB, Compression::None);
        let part = part_size(&big) as u64;
        assert!(part * MAX_PARTS >= big.max_input_bytes, "{part}");
        assert!(
            part < 64 * 1024 * 1024,
            "parts stay small enough for constant memory: {part}"
        );
    }

    #[test]
    fn unknown_option_is_refused_by_name() {
        let err = store_from_url("s3://bucket/p", &opts(&[("secret_acess_key", "hunter2")]));
        match err {
            Err(StoreError::UnknownOption { key, scheme, .. }) => {
                assert_eq!(key, "secret_acess_key");
                assert_eq!(scheme, "s3");
            }
            other => panic!("expected UnknownOption, got {other:?}"),
        }
        let err = store_from_url("memory://", &opts(&[("region", "x")])).err();
        assert!(
            matches!(err, Some(StoreError::UnknownOption { .. })),
            "{err:?}"
        );
        let err = store_from_url("ftp://host/x", &[]).err();
        assert!(
            matches!(err, Some(StoreError::UnsupportedScheme { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn debug_never_shows_secrets() {
        let cfg = StoreConfig::new(
            "s3://bucket/prefix",
            &opts(&[
                ("access_key_id", "AKIAEXAMPLE"),
                ("secret_access_key", "hunter2"),
                ("session_token", "tok"),
            ]),
        )
        .expect("config");
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok\""),
            "{shown}"
        );
        assert!(
            shown.contains("<redacted>") && shown.contains("AKIAEXAMPLE"),
            "{shown}"
        );
        let with_userinfo = StoreConfig::new("s3://user:pw@bucket/p", &[]).expect("config");
        assert!(!format!("{with_userinfo:?}").contains("pw@"));
    }

    #[test]
    fn s3_store_builds_with_explicit_endpoint_and_prefix() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (_, prefix) = store_from_url(
            "s3://bucket/some/prefix/",
            &opts(&[
                ("endpoint", "http://127.0.0.1:9"),
                ("region", "us-east-1"),
                ("allow_http", "true"),
                ("access_key_id", "a"),
                ("secret_access_key", "b"),
            ]),
        )
        .expect("s3 store");
        assert_eq!(prefix.as_ref(), "some/prefix");
    }

    #[tokio::test]
    async fn file_store_creates_its_directory_and_stores_under_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("new/store");
        let url = url::Url::from_directory_path(&root)
            .expect("url")
            .to_string();
        let (store, prefix) = store_from_url(&url, &[]).expect("file store");
        assert!(root.is_dir());
        assert!(prefix.is_root());
        store
            .put(&Path::from("a/b"), PutPayload::from_static(b"x"))
            .await
            .expect("put");
        assert!(root.join("a/b").is_file());
    }

    fn manifest(attempt: u32) -> Manifest {
        let keys = object_keys(&Path::default(), &run(), 0, "/out", Compression::None);
        let ctx = ManifestContext {
            run: run(),
            declared_path: "/out".into(),
            index: 0,
            attempt,
        };
        let outcome = DrainOutcome {
            bytes: 3,
            ..DrainOutcome::default()
        };
        let t = jiff::Timestamp::UNIX_EPOCH;
        Manifest::new(
            &ctx,
            &keys,
            &DrainOptions::new(10, Compression::None),
            &outcome,
            t,
            t,
        )
    }

    #[tokio::test]
    async fn manifest_is_create_only_and_a_second_write_reads_the_first_back() {
        let (store, _) = store_from_url("memory://", &[]).expect("memory store");
        let key = Path::from("ns/job/uid/00-out.manifest.json");
        let first = manifest(1);
        assert_eq!(
            write_manifest(&store, &key, &first).await.expect("write"),
            ManifestWrite::Created
        );
        let second = write_manifest(&store, &key, &manifest(2))
            .await
            .expect("write");
        assert_eq!(
            second,
            ManifestWrite::AlreadyCommitted(Box::new(first.clone()))
        );
        assert_eq!(read_manifest(&store, &key).await.expect("read").attempt, 1);
        assert!(
            first.started_at.ends_with('Z'),
            "RFC 3339: {}",
            first.started_at
        );
    }

    #[tokio::test]
    async fn list_manifests_returns_every_committed_path_of_a_run_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url::Url::from_directory_path(dir.path())
            .expect("url")
            .to_string();
        let (store, prefix) = store_from_url(&url, &[]).expect("file store");
        let keys0 = object_keys(&prefix, &run(), 0, "/a", Compression::None);
        let keys1 = object_keys(&prefix, &run(), 1, "/b", Compression::Gzip);
        write_manifest(&store, &keys1.manifest, &manifest(1))
            .await
            .expect("write");
        write_manifest(&store, &keys0.manifest, &manifest(1))
            .await
            .expect("write");
        store
            .put(&keys0.archive, PutPayload::from_static(b"tar"))
            .await
            .expect("put");
        let other = RunRef {
            name: "other".into(),
            ..run()
        };
        let keys_other = object_keys(&prefix, &other, 0, "/a", Compression::None);
        write_manifest(&store, &keys_other.manifest, &manifest(1))
            .await
            .expect("write");
        let listed = list_manifests(&store, &prefix, "ns", "job")
            .await
            .expect("list");
        let listed: Vec<_> = listed.into_iter().map(|(k, _)| k).collect();
        assert_eq!(listed, vec![keys0.manifest, keys1.manifest]);
        let missing = read_manifest(&store, &Path::from("nope.manifest.json")).await;
        assert!(
            matches!(missing, Err(StoreError::NotFound { .. })),
            "{missing:?}"
        );
    }

    #[tokio::test]
    async fn aborting_after_a_failed_final_upload_does_not_panic() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("store");
        let url = url::Url::from_directory_path(&root)
            .expect("url")
            .to_string();
        let (store, prefix) = store_from_url(&url, &[]).expect("store");
        // The store becomes unusable (as an unreachable S3 is) before the upload completes.
        std::fs::remove_dir_all(&root).expect("remove root");
        std::fs::write(&root, b"not a directory").expect("block root");
        let opts = DrainOptions::new(1024, Compression::None);
        let mut w = archive_writer(store, prefix.clone().join("a.tar"), &opts);
        w.write_all(b"some archive bytes").await.expect("buffered");
        assert!(w.shutdown().await.is_err(), "the final PUT must fail");
        // BufWriter::abort panics here ("Already shut down"); ours must not.
        w.abort()
            .await
            .expect("abort after a failed shutdown is a no-op");
    }
}
