//! The store a URL and its options name. Options are validated against a per-scheme allow-list
//! (object_store's own parser silently ignores unknown keys, which turns a typo in
//! `secret_acess_key` into an anonymous client); values are checked by the builders.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use super::error::StoreError;

/// The store flags, the same for every subcommand that needs the store (`run`, `files`):
/// flattened into their arguments. Global, so `files ls RUN --store-url …` works after the
/// subcommand too.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct StoreArgs {
    /// Object store URL: file:///dir (embedded default), s3://bucket/prefix, gs://…, az://….
    #[arg(
        long,
        global = true,
        env = "SANDBOXRUN_STORE_URL",
        default_value = "file:///var/lib/sandboxrun/store"
    )]
    pub store_url: String,
    /// `--store-option`.
    #[command(flatten)]
    pub store_options: StoreOptions,
}

impl StoreArgs {
    /// The options as `(key, value)` pairs ([`parse_options`]).
    pub fn options(&self) -> Result<Vec<(String, String)>, OptionError> {
        self.store_options.parse()
    }
}

/// `--store-option`, the one flag every subcommand that opens the store takes (`run`'s
/// [`StoreArgs`], `files`'s `FilesStoreArgs`, whose URL has no default).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Store options as key=value (repeatable / comma-separated), e.g. endpoint=http://…,allow_http=true.
    #[arg(
        long = "store-option",
        global = true,
        env = "SANDBOXRUN_STORE_OPTIONS",
        value_delimiter = ','
    )]
    pub options: Vec<String>,
}

impl StoreOptions {
    /// The options as `(key, value)` pairs ([`parse_options`]).
    pub fn parse(&self) -> Result<Vec<(String, String)>, OptionError> {
        parse_options(&self.options)
    }
}

/// A store option that is not `key=value`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store option {option:?} is not key=value")]
pub struct OptionError {
    /// The option as written.
    pub option: String,
}

/// Splits `key=value` options (store options from flags and environment); blank ones are skipped.
pub fn parse_options(raw: &[String]) -> Result<Vec<(String, String)>, OptionError> {
    raw.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| OptionError { option: s.clone() })
        })
        .collect()
}

/// A store URL and its options, as configured. Its `Debug` redacts credential values, so it can be
/// logged.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    url: String,
    options: Vec<(String, String)>,
    /// Built from its URL and options only, never from the operator's environment (a tenant's
    /// store: docs/contract.md "A store per namespace").
    isolated: bool,
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
            isolated: false,
        })
    }

    /// The same configuration built from its URL and options only: no `AWS_*`/`AZURE_*`/
    /// `GOOGLE_*` variable of the operator's environment reaches it (a tenant's store never
    /// borrows the operator's credentials or endpoint; docs/contract.md "A store per namespace").
    pub(crate) fn isolated(mut self) -> Self {
        self.isolated = true;
        self
    }

    /// The S3 client settings this configuration names: the environment, then the URL's bucket,
    /// then the options. The store and the clean-up of open multipart uploads
    /// (`open_uploads`) both start from it, so they sign with the same credentials and talk to
    /// the same endpoint.
    pub(crate) fn s3_builder(&self) -> Result<AmazonS3Builder, StoreError> {
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
        let base = if self.isolated {
            AmazonS3Builder::new()
        } else {
            AmazonS3Builder::from_env()
        };
        let mut b = base.with_url(bucket);
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
                let base = if self.isolated {
                    GoogleCloudStorageBuilder::new()
                } else {
                    GoogleCloudStorageBuilder::from_env()
                };
                let mut b = base.with_url(bucket()?).with_retry(retry_config());
                for (k, v) in &self.options {
                    let key = GoogleConfigKey::from_str(k).map_err(build_err)?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(build_err)?)
            }
            "az" => {
                let base = if self.isolated {
                    MicrosoftAzureBuilder::new()
                } else {
                    MicrosoftAzureBuilder::from_env()
                };
                let mut b = base.with_url(bucket()?).with_retry(retry_config());
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

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::{ObjectStoreExt, PutPayload};

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
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
}
