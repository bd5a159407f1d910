//! A store per namespace, the pure part (docs/contract.md "A store per namespace"): which store a
//! run's drain uses (its `spec.readBack.storeRef`, else its namespace's default store ConfigMap,
//! else the operator's `--store-url`), the tenant store a ConfigMap and its Secret describe, and
//! the platform's allowlist of the endpoints tenant credentials may be sent to
//! (`run --tenant-store-endpoints`) and of the Secret names a store may name
//! (`run --tenant-store-secret-names`). Reading the ConfigMap and the Secret is
//! [`super::tenant_read`]'s.
//!
//! A tenant's store is built from the ConfigMap and the Secret only, never from the operator's
//! environment ([`super::StoreConfig`]'s isolated build): no tenant borrows the operator's
//! identity, and no tenant's credentials reach an endpoint the platform did not allow.

use std::collections::BTreeMap;

use super::config::StoreConfig;
use super::error::StoreError;
use super::tenant_gcs;

/// The well-known name of a namespace's default store ConfigMap.
pub const DEFAULT_STORE_CONFIGMAP: &str = "sandboxrun-store";

/// The store ConfigMap's keys.
pub const KEY_URL: &str = "url";
/// `k=v` store options, one a line or comma-separated (as `--store-option` takes them).
pub const KEY_OPTIONS: &str = "options";
/// The Secret, in the same namespace, holding the store's credentials.
pub const KEY_SECRET_NAME: &str = "secretName";

/// The label by which a Secret consents to be a tenant store's credentials (value `"true"`):
/// whoever may edit a store ConfigMap cannot point the operator at any other Secret of the
/// namespace (docs/contract.md "A store per namespace", "A Secret is a store's credentials only
/// when it says so").
pub const CREDENTIALS_LABEL: &str = "sandbox.iterion.io/store-credentials";

/// Why a tenant store could not be used. Every message names the store it is about.
#[derive(Debug, thiserror::Error)]
pub enum TenantStoreError {
    /// A run names a store while this cluster has tenant stores off.
    #[error(
        "spec.readBack.storeRef names the store ConfigMap {namespace}/{name}, but tenant stores \
         are off in this cluster (the operator runs without --tenant-store-endpoints)"
    )]
    Off {
        /// The run's namespace.
        namespace: String,
        /// The ConfigMap named.
        name: String,
    },
    /// The store ConfigMap or its Secret does not exist.
    #[error("the store {kind} {namespace}/{name} does not exist")]
    Missing {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The store ConfigMap or its Secret could not be read.
    #[error("the store {kind} {namespace}/{name} could not be read: {reason}")]
    Unreadable {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The apiserver's words.
        reason: String,
    },
    /// The store ConfigMap or its Secret could not be read for a reason that may pass (the
    /// apiserver unreachable, overloaded or failing): the caller retries rather than failing
    /// the drain.
    #[error("the store {kind} {namespace}/{name} could not be read (retried): {source}")]
    Transient {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The client's error.
        source: Box<kube::Error>,
    },
    /// The ConfigMap or the Secret does not describe a store a tenant may use.
    #[error("the store ConfigMap {store}: {reason}")]
    Invalid {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// What is wrong (never a credential's value).
        reason: String,
    },
    /// The store's endpoint is not one the platform allows tenant credentials to be sent to.
    #[error(
        "the store ConfigMap {store} ({url}) sends its credentials to {endpoint}, which is not \
         in the platform's --tenant-store-endpoints; refused"
    )]
    EndpointRefused {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// The store URL.
        url: String,
        /// The endpoint its requests would go to.
        endpoint: String,
    },
    /// The Secret a store ConfigMap names is missing or cannot be read.
    #[error("the store ConfigMap {store}: its credentials: {source}")]
    Credentials {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// What went wrong with the Secret ([`TenantStoreError::Missing`] or
        /// [`TenantStoreError::Unreadable`], or the Secret's data refused).
        source: Box<TenantStoreError>,
    },
    /// The ConfigMap names a Secret the platform does not let the operator read.
    #[error(
        "the store ConfigMap {store} names the Secret {secret:?}, but the platform lets the \
         operator read only the store Secrets named {allowed} (--tenant-store-secret-names); refused"
    )]
    SecretRefused {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// The Secret it names.
        secret: String,
        /// The names allowed, comma-separated.
        allowed: String,
    },
    /// The Secret a store ConfigMap names does not carry [`CREDENTIALS_LABEL`]: it never
    /// consented to be a store's credentials.
    #[error(
        "the store ConfigMap {store} names the Secret {namespace}/{secret}, which is not marked \
         as store credentials; refused: add the label sandbox.iterion.io/store-credentials=true \
         to it (kubectl label secret -n {namespace} {secret} \
         sandbox.iterion.io/store-credentials=true; only who may write that Secret can)"
    )]
    NotConsented {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// The Secret's namespace.
        namespace: String,
        /// The Secret it names.
        secret: String,
    },
    /// The store could not be configured.
    #[error("the store ConfigMap {store}: {source}")]
    Store {
        /// `namespace/name` of the ConfigMap.
        store: String,
        /// Why.
        source: Box<StoreError>,
    },
}

/// One pattern of `--tenant-store-endpoints`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum EndpointPattern {
    /// A URL prefix (`http://10.0.0.5:9000`, `https://minio.example.com/`), matched on a path
    /// boundary: the endpoint is it, or continues it with `/`.
    Prefix(String),
    /// An HTTPS host (`s3.eu-west-1.amazonaws.com`) or a host suffix (`*.blob.core.windows.net`):
    /// matched against `https://` endpoints only (plain HTTP needs a URL prefix naming it).
    Host(String),
}

/// Why `--tenant-store-endpoints` or `--tenant-store-secret-names` is refused (the operator does
/// not start; a published copy of them is not believed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantPolicyError {
    /// A URL prefix that is not a URL.
    #[error("--tenant-store-endpoints: {pattern:?} is not a URL: {source}")]
    NotAUrl {
        /// The pattern.
        pattern: String,
        /// Why.
        #[source]
        source: url::ParseError,
    },
    /// A URL prefix without a host.
    #[error("--tenant-store-endpoints: {0:?} names no host")]
    NoHost(String),
    /// Neither a URL prefix nor a host.
    #[error("--tenant-store-endpoints: {0:?} is neither a URL prefix nor a host (or *.suffix)")]
    NotAPattern(String),
    /// Not a Secret's name.
    #[error("--tenant-store-secret-names: {0:?} is not a Secret name (a DNS subdomain)")]
    NotASecretName(String),
}

/// What is wrong with a store ConfigMap or its Secret besides its URL (the reason of
/// [`TenantStoreError::Invalid`]; never a credential's value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreDescriptionError {
    /// An option that is not `key=value`.
    #[error(transparent)]
    Option(#[from] super::OptionError),
    /// An option a tenant may not set.
    #[error(
        "option {key:?} is not one a tenant store may set (accepted: {accepted}; credentials \
         belong in the Secret named by {secret_name})",
        secret_name = KEY_SECRET_NAME
    )]
    OptionNotAllowed {
        /// The option.
        key: String,
        /// The options accepted, comma-separated.
        accepted: String,
    },
    /// A Secret key the scheme does not take.
    #[error(
        "its Secret has the key {key:?}, which a {scheme}:// tenant store does not take (accepted: {accepted})"
    )]
    SecretKeyNotTaken {
        /// The key.
        key: String,
        /// The store's scheme.
        scheme: String,
        /// The keys accepted, comma-separated.
        accepted: String,
    },
    /// Not enough credentials to sign.
    #[error(
        "its Secret lacks {0} (a tenant store signs with its own credentials, never the operator's)"
    )]
    CannotSign(&'static str),
    /// A gs:// store without its service-account key.
    #[error("its Secret lacks {key}", key = tenant_gcs::SECRET_KEY)]
    NoServiceAccountKey,
    /// A gs:// store's service-account key refused.
    #[error(transparent)]
    ServiceAccountKey(#[from] tenant_gcs::KeyError),
    /// An az:// store without an account.
    #[error(
        "an az:// store needs an account: option account_name or AZURE_STORAGE_ACCOUNT_NAME in its Secret, or an endpoint"
    )]
    NoAzureAccount,
}

/// The platform's rules for tenant stores: the endpoints their credentials may be sent to (`run
/// --tenant-store-endpoints`; empty: tenant stores are off, every run uses the operator's store)
/// and, when the platform narrows them, the only Secret names a store ConfigMap may name (`run
/// --tenant-store-secret-names`; the chart grants the operator `get` on those names only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantStorePolicy {
    patterns: Vec<EndpointPattern>,
    secret_names: Vec<String>,
}

impl TenantStorePolicy {
    /// Parses the flag's patterns (blank ones skipped).
    pub fn parse(raw: &[String]) -> Result<TenantStorePolicy, TenantPolicyError> {
        let mut patterns = Vec::new();
        for p in raw.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            if p.contains("://") {
                let url = url::Url::parse(p).map_err(|source| TenantPolicyError::NotAUrl {
                    pattern: p.to_string(),
                    source,
                })?;
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(TenantPolicyError::NoHost(p.to_string()));
                }
                patterns.push(EndpointPattern::Prefix(p.trim_end_matches('/').to_string()));
            } else {
                let host = p.to_ascii_lowercase();
                let bare = host.strip_prefix("*.").unwrap_or(&host);
                if bare.is_empty() || bare.contains(['/', '*', ':', '@']) {
                    return Err(TenantPolicyError::NotAPattern(p.to_string()));
                }
                patterns.push(EndpointPattern::Host(host));
            }
        }
        Ok(TenantStorePolicy {
            patterns,
            secret_names: Vec::new(),
        })
    }

    /// The same policy with store Secrets narrowed to `names` (blank ones skipped; none: any
    /// name). Each must be a Secret's name (a DNS subdomain).
    pub fn with_secret_names(
        mut self,
        names: &[String],
    ) -> Result<TenantStorePolicy, TenantPolicyError> {
        let mut kept: Vec<String> = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if !crate::names::is_dns1123_subdomain(name) {
                return Err(TenantPolicyError::NotASecretName(name.to_string()));
            }
            if !kept.iter().any(|k| k == name) {
                kept.push(name.to_string());
            }
        }
        self.secret_names = kept;
        Ok(self)
    }

    /// The endpoint patterns as the flag takes them (normalised), for a record of the settings.
    pub fn patterns(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|p| match p {
                EndpointPattern::Prefix(p) | EndpointPattern::Host(p) => p.clone(),
            })
            .collect()
    }

    /// The Secret names store ConfigMaps may name (empty: any).
    pub fn secret_names(&self) -> &[String] {
        &self.secret_names
    }

    /// Why the store ConfigMap `store` may not name the Secret `secret`: None when it may
    /// (checked before the Secret is read, so a refused name is never fetched).
    pub fn secret_refused(&self, store: &str, secret: &str) -> Option<TenantStoreError> {
        if self.secret_names.is_empty() || self.secret_names.iter().any(|n| n == secret) {
            return None;
        }
        Some(TenantStoreError::SecretRefused {
            store: store.into(),
            secret: secret.into(),
            allowed: self.secret_names.join(", "),
        })
    }

    /// Whether tenant stores are on.
    pub fn enabled(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Whether credentials may be sent to `endpoint` (a URL).
    pub fn allows(&self, endpoint: &str) -> bool {
        let Ok(url) = url::Url::parse(endpoint) else {
            return false;
        };
        // No userinfo: nothing but the platform's host may be named.
        if !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let text = endpoint.trim_end_matches('/');
        self.patterns.iter().any(|p| match p {
            EndpointPattern::Prefix(prefix) => {
                text == prefix
                    || text
                        .strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            EndpointPattern::Host(pattern) => {
                url.scheme() == "https"
                    && match pattern.strip_prefix("*.") {
                        Some(suffix) => host
                            .strip_suffix(suffix)
                            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                        None => host == *pattern,
                    }
            }
        })
    }
}

/// Where a run's drain looks for its store, before anything is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// The operator's `--store-url`.
    Operator,
    /// A store ConfigMap of the run's namespace.
    ConfigMap {
        /// Its name.
        name: String,
        /// Named by the run (`spec.readBack.storeRef`): its absence is an error. Otherwise the
        /// namespace's default, whose absence means the operator's store.
        named_by_run: bool,
    },
}

/// The precedence (docs/contract.md "A store per namespace"): the run's `storeRef`, else the
/// namespace's default ConfigMap, else the operator's store. Tenant stores off: the operator's
/// store, and a run that names one is refused.
pub fn choose(
    namespace: &str,
    store_ref: Option<&str>,
    endpoints: &TenantStorePolicy,
) -> Result<StoreChoice, TenantStoreError> {
    match (store_ref, endpoints.enabled()) {
        (Some(name), false) => Err(TenantStoreError::Off {
            namespace: namespace.into(),
            name: name.into(),
        }),
        (None, false) => Ok(StoreChoice::Operator),
        (Some(name), true) => Ok(StoreChoice::ConfigMap {
            name: name.into(),
            named_by_run: true,
        }),
        (None, true) => Ok(StoreChoice::ConfigMap {
            name: DEFAULT_STORE_CONFIGMAP.into(),
            named_by_run: false,
        }),
    }
}

/// Whether the Secret `secret` (in `namespace`, with `labels`), named by the store ConfigMap
/// `store`, consented to be store credentials: it carries [`CREDENTIALS_LABEL`] `"true"`. Whoever
/// may edit a store ConfigMap may name any Secret; only who may write that Secret can label it
/// (docs/contract.md "A store per namespace").
pub fn secret_consents(
    store: &str,
    namespace: &str,
    secret: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<(), TenantStoreError> {
    let marked = labels
        .and_then(|labels| labels.get(CREDENTIALS_LABEL))
        .is_some_and(|value| value == "true");
    if marked {
        return Ok(());
    }
    Err(TenantStoreError::NotConsented {
        store: store.into(),
        namespace: namespace.into(),
        secret: secret.into(),
    })
}

/// A tenant's store, as its ConfigMap and Secret describe it (credentials inside: never logged;
/// its `Debug` redacts them).
#[derive(Debug)]
pub struct TenantStore {
    /// `namespace/name` of the ConfigMap.
    pub store: String,
    /// The store URL.
    pub url: String,
    /// Where its requests (and so its credentials) go.
    pub endpoint: String,
    /// The store, built from these only.
    pub config: StoreConfig,
}

/// The Secret key (environment style, as the operator's own store Secret has them) of each
/// credential a tenant store takes, and the store option it sets.
const S3_SECRET_KEYS: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "access_key_id"),
    ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
    ("AWS_SESSION_TOKEN", "session_token"),
];
const AZURE_SECRET_KEYS: &[(&str, &str)] = &[
    ("AZURE_STORAGE_ACCOUNT_NAME", "account_name"),
    ("AZURE_STORAGE_ACCOUNT_KEY", "access_key"),
    ("AZURE_STORAGE_SAS_KEY", "sas_key"),
];
/// The service-account key itself (its JSON), judged by [`super::tenant_gcs`].
const GCS_SECRET_KEYS: &[(&str, &str)] = &[(tenant_gcs::SECRET_KEY, "service_account_key")];

/// The options a tenant's ConfigMap may set: where the store is and how to talk to it, never a
/// credential (those are the Secret's), a file of the operator's, a proxy or an identity of the
/// platform's (IMDS, web identity, managed identity).
const S3_TENANT_OPTIONS: &[&str] = &[
    "endpoint",
    "region",
    "allow_http",
    "virtual_hosted_style_request",
    "conditional_put",
    "checksum_algorithm",
    "unsigned_payload",
    "timeout",
    "connect_timeout",
];
const AZURE_TENANT_OPTIONS: &[&str] = &[
    "endpoint",
    "account_name",
    "allow_http",
    "timeout",
    "connect_timeout",
];
/// gs://: where the store is comes from its key (`gcs_base_url`), judged there; never a key file
/// (`service_account`), application-default credentials or the metadata server.
const GCS_TENANT_OPTIONS: &[&str] = &["allow_http", "timeout", "connect_timeout"];

/// The tenant store the ConfigMap `store` (`namespace/name`) describes with `data`, and its
/// Secret's `secret` data; refused unless its endpoint is one `endpoints` allows.
pub fn tenant_store(
    store: &str,
    data: &BTreeMap<String, String>,
    secret: &BTreeMap<String, String>,
    endpoints: &TenantStorePolicy,
) -> Result<TenantStore, TenantStoreError> {
    described(store, data, secret, |endpoint| endpoints.allows(endpoint))
}

/// The tenant store as a reader (`files`, with the reader's own right to the Secret) opens it:
/// the same rules, except the platform's endpoint allowlist, which is the operator's (the
/// reader sends the namespace's own credentials where the namespace's ConfigMap says).
pub fn for_reader(
    store: &str,
    data: &BTreeMap<String, String>,
    secret: &BTreeMap<String, String>,
) -> Result<TenantStore, TenantStoreError> {
    described(store, data, secret, |_| true)
}

/// The tenant store `data` and `secret` describe, refused unless `allowed` its endpoint.
fn described(
    store: &str,
    data: &BTreeMap<String, String>,
    secret: &BTreeMap<String, String>,
    allowed: impl Fn(&str) -> bool,
) -> Result<TenantStore, TenantStoreError> {
    let invalid = |reason: String| TenantStoreError::Invalid {
        store: store.into(),
        reason,
    };
    let url = data
        .get(KEY_URL)
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| invalid(format!("it has no {KEY_URL:?} key (the store URL)")))?;
    let scheme = url::Url::parse(&url)
        .map(|u| u.scheme().to_string())
        .map_err(|e| invalid(format!("{KEY_URL} {url:?} is not a URL: {e}")))?;
    let (allowed_options, secret_keys) = match scheme.as_str() {
        "s3" => (S3_TENANT_OPTIONS, S3_SECRET_KEYS),
        "az" => (AZURE_TENANT_OPTIONS, AZURE_SECRET_KEYS),
        "gs" => (GCS_TENANT_OPTIONS, GCS_SECRET_KEYS),
        other => {
            return Err(invalid(format!(
                "a tenant store is s3://, az:// or gs:// ({other}:// is not: the operator's own \
                 disk and its memory are not offered to tenants)"
            )))
        }
    };
    let described = |e: StoreDescriptionError| invalid(e.to_string());
    let mut options = tenant_options(data, allowed_options).map_err(described)?;
    options.extend(secret_options(secret, secret_keys, &scheme).map_err(described)?);
    let endpoints = endpoints_of(&scheme, &mut options).map_err(described)?;
    if let Some(refused) = endpoints.iter().find(|e| !allowed(e)) {
        return Err(TenantStoreError::EndpointRefused {
            store: store.into(),
            url,
            endpoint: refused.clone(),
        });
    }
    let endpoint = endpoints.into_iter().next().unwrap_or_default();
    let config = StoreConfig::new(&url, &options)
        .map_err(|source| TenantStoreError::Store {
            store: store.into(),
            source: Box::new(source),
        })?
        .isolated();
    Ok(TenantStore {
        store: store.into(),
        url,
        endpoint,
        config,
    })
}

/// The ConfigMap's options, each one a tenant may set.
fn tenant_options(
    data: &BTreeMap<String, String>,
    allowed: &[&str],
) -> Result<Vec<(String, String)>, StoreDescriptionError> {
    let raw: Vec<String> = data
        .get(KEY_OPTIONS)
        .map(|o| o.split(['\n', ',']).map(str::to_string).collect())
        .unwrap_or_default();
    let options = super::parse_options(&raw)?;
    for (key, _) in &options {
        if !allowed.contains(&key.as_str()) {
            return Err(StoreDescriptionError::OptionNotAllowed {
                key: key.clone(),
                accepted: allowed.join(", "),
            });
        }
    }
    Ok(options)
}

/// The Secret's credentials as store options: only the keys the scheme takes, and enough of them
/// to sign (a tenant store never falls back to the operator's identity).
fn secret_options(
    secret: &BTreeMap<String, String>,
    keys: &[(&str, &str)],
    scheme: &str,
) -> Result<Vec<(String, String)>, StoreDescriptionError> {
    let accepted = || keys.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    for (key, value) in secret {
        let Some((_, option)) = keys.iter().find(|(k, _)| k == key) else {
            return Err(StoreDescriptionError::SecretKeyNotTaken {
                key: key.clone(),
                scheme: scheme.to_string(),
                accepted: accepted(),
            });
        };
        out.push(((*option).to_string(), value.trim().to_string()));
    }
    let has = |option: &str| out.iter().any(|(k, v)| k == option && !v.is_empty());
    let signs = match scheme {
        "s3" => has("access_key_id") && has("secret_access_key"),
        "gs" => has("service_account_key"),
        _ => has("access_key") || has("sas_key"),
    };
    if !signs {
        let needed = match scheme {
            "s3" => "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            "gs" => "GOOGLE_SERVICE_ACCOUNT_KEY (a service account's key file, its JSON)",
            _ => "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY",
        };
        return Err(StoreDescriptionError::CannotSign(needed));
    }
    Ok(out)
}

/// Every endpoint a store's credentials go to, where its requests go first. gs://: those its
/// service-account key names (or their defaults), the key judged and replaced by its rebuilt
/// form ([`tenant_gcs::judged`]); else the one [`endpoint_of`] says.
fn endpoints_of(
    scheme: &str,
    options: &mut [(String, String)],
) -> Result<Vec<String>, StoreDescriptionError> {
    if scheme != "gs" {
        return endpoint_of(scheme, options).map(|e| vec![e]);
    }
    let Some((_, key)) = options.iter_mut().find(|(k, _)| k == "service_account_key") else {
        return Err(StoreDescriptionError::NoServiceAccountKey);
    };
    let judged = tenant_gcs::judged(key)?;
    *key = judged.json;
    Ok(judged.endpoints.into_iter().map(|(_, url)| url).collect())
}

/// Where a store's requests go: its `endpoint` option, else the cloud's own endpoint.
fn endpoint_of(
    scheme: &str,
    options: &[(String, String)],
) -> Result<String, StoreDescriptionError> {
    let get = |key: &str| {
        options
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    if let Some(endpoint) = get("endpoint") {
        return Ok(endpoint);
    }
    match scheme {
        "s3" => Ok(format!(
            "https://s3.{}.amazonaws.com",
            get("region").unwrap_or_else(|| "us-east-1".into())
        )),
        _ => get("account_name")
            .map(|account| format!("https://{account}.blob.core.windows.net"))
            .ok_or(StoreDescriptionError::NoAzureAccount),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn endpoints(patterns: &[&str]) -> TenantStorePolicy {
        TenantStorePolicy::parse(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>())
            .expect("patterns")
    }

    fn s3_secret() -> BTreeMap<String, String> {
        map(&[
            ("AWS_ACCESS_KEY_ID", "AKIATENANT"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2"),
        ])
    }

    #[test]
    fn the_run_s_store_ref_then_the_namespace_default_then_the_operator_s_store() {
        let on = endpoints(&["*.amazonaws.com"]);
        assert_eq!(
            choose("team", Some("fast"), &on).expect("choice"),
            StoreChoice::ConfigMap {
                name: "fast".into(),
                named_by_run: true
            }
        );
        assert_eq!(
            choose("team", None, &on).expect("choice"),
            StoreChoice::ConfigMap {
                name: DEFAULT_STORE_CONFIGMAP.into(),
                named_by_run: false
            }
        );
        // Off: the operator's store, and a run naming a store is refused, never served by the
        // operator's store instead.
        let off = TenantStorePolicy::default();
        assert_eq!(
            choose("team", None, &off).expect("choice"),
            StoreChoice::Operator
        );
        let err = choose("team", Some("fast"), &off).expect_err("off");
        assert!(err.to_string().contains("team/fast"), "{err}");
        assert!(
            err.to_string().contains("--tenant-store-endpoints"),
            "{err}"
        );
    }

    #[test]
    fn endpoint_patterns_match_on_boundaries_and_hosts_only_over_https() {
        let e = endpoints(&[
            "http://127.0.0.1:19000",
            "https://minio.example.com/tenants/",
            "*.amazonaws.com",
            "blob.example.net",
        ]);
        assert!(e.enabled());
        assert!(e.allows("http://127.0.0.1:19000"));
        assert!(e.allows("http://127.0.0.1:19000/"));
        assert!(!e.allows("http://127.0.0.1:190001"));
        assert!(!e.allows("http://127.0.0.1:19001"));
        assert!(e.allows("https://minio.example.com/tenants/a"));
        assert!(!e.allows("https://minio.example.com/other"));
        assert!(!e.allows("https://minio.example.com.evil.io/tenants"));
        assert!(e.allows("https://s3.eu-west-1.amazonaws.com"));
        assert!(!e.allows("http://s3.eu-west-1.amazonaws.com"));
        assert!(!e.allows("https://amazonaws.com.evil.io"));
        assert!(!e.allows("https://evilamazonaws.com"));
        assert!(e.allows("https://blob.example.net"));
        assert!(!e.allows("https://x.blob.example.net"));
        assert!(!e.allows("http://user@127.0.0.1:19000"));
        assert!(!e.allows("not a url"));
        assert!(TenantStorePolicy::parse(&["*".into()]).is_err());
        assert!(TenantStorePolicy::parse(&["http://".into()]).is_err());
        assert!(!TenantStorePolicy::parse(&[" ".into()])
            .expect("blank")
            .enabled());
    }

    #[test]
    fn a_tenant_s3_store_signs_with_its_secret_at_an_allowed_endpoint() {
        let cm = map(&[
            ("url", "s3://tenant-a/runs"),
            (
                "options",
                "endpoint=http://127.0.0.1:19000\nregion=us-east-1,allow_http=true",
            ),
            ("secretName", "store-creds"),
        ]);
        let store = tenant_store(
            "team/sandboxrun-store",
            &cm,
            &s3_secret(),
            &endpoints(&["http://127.0.0.1:19000"]),
        )
        .expect("tenant store");
        assert_eq!(store.url, "s3://tenant-a/runs");
        assert_eq!(store.endpoint, "http://127.0.0.1:19000");
        let shown = format!("{store:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        // No endpoint: the cloud's, which must itself be allowed.
        let aws = map(&[("url", "s3://b/p"), ("options", "region=eu-west-1")]);
        let store =
            tenant_store("t/s", &aws, &s3_secret(), &endpoints(&["*.amazonaws.com"])).expect("aws");
        assert_eq!(store.endpoint, "https://s3.eu-west-1.amazonaws.com");
    }

    #[test]
    fn an_endpoint_the_platform_did_not_allow_is_refused_naming_the_store() {
        let cm = map(&[
            ("url", "s3://b/p"),
            ("options", "endpoint=https://collector.evil.io"),
        ]);
        let err = tenant_store(
            "team/sandboxrun-store",
            &cm,
            &s3_secret(),
            &endpoints(&["*.amazonaws.com"]),
        )
        .expect_err("refused");
        assert!(
            matches!(err, TenantStoreError::EndpointRefused { .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("team/sandboxrun-store") && text.contains("https://collector.evil.io"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn the_operator_s_disk_memory_and_identity_are_not_offered_to_tenants() {
        let on = endpoints(&["http://127.0.0.1:19000", "*.amazonaws.com"]);
        for url in ["file:///var/lib/sandboxrun/store", "memory://"] {
            let cm = map(&[("url", url)]);
            let err = tenant_store("t/s", &cm, &s3_secret(), &on).expect_err(url);
            assert!(
                err.to_string().contains("s3://, az:// or gs://"),
                "{url}: {err}"
            );
        }
        // No credentials: refused, never signed with the operator's identity.
        let cm = map(&[("url", "s3://b/p")]);
        let err = tenant_store("t/s", &cm, &BTreeMap::new(), &on).expect_err("no creds");
        assert!(err.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{err}");
        let half = map(&[("AWS_ACCESS_KEY_ID", "a")]);
        assert!(tenant_store("t/s", &cm, &half, &on).is_err());
        // Credentials, files of the operator's and identities are not options a tenant sets.
        for option in [
            "secret_access_key=x",
            "web_identity_token_file=/var/run/secrets/token",
            "imdsv1_fallback=true",
            "proxy_url=http://proxy",
        ] {
            let cm = map(&[("url", "s3://b/p"), ("options", option)]);
            let err = tenant_store("t/s", &cm, &s3_secret(), &on).expect_err(option);
            assert!(
                err.to_string().contains("not one a tenant store may set"),
                "{option}: {err}"
            );
        }
        // A Secret key the scheme does not take is named (never its value).
        let mut odd = s3_secret();
        odd.insert("AWS_WEB_IDENTITY_TOKEN_FILE".into(), "/token".into());
        let err = tenant_store("t/s", &cm, &odd, &on).expect_err("odd key");
        assert!(
            err.to_string().contains("AWS_WEB_IDENTITY_TOKEN_FILE"),
            "{err}"
        );
    }

    #[test]
    fn narrowed_secret_names_refuse_any_other_name_and_unnarrowed_ones_refuse_none() {
        let open = endpoints(&["*.amazonaws.com"]);
        assert!(open.secret_refused("t/s", "anything").is_none());
        let names = [
            "store-creds".to_string(),
            " ".to_string(),
            "store-creds".to_string(),
        ];
        let narrowed = open.clone().with_secret_names(&names).expect("names");
        assert_eq!(narrowed.secret_names(), ["store-creds".to_string()]);
        assert!(narrowed.secret_refused("t/s", "store-creds").is_none());
        let refused = narrowed
            .secret_refused("t/s", "default-token")
            .expect("refused")
            .to_string();
        assert!(
            refused.contains("t/s")
                && refused.contains("\"default-token\"")
                && refused.contains("store-creds"),
            "{refused}"
        );
        let bad = open
            .with_secret_names(&["Not_A_Name".to_string()])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("--tenant-store-secret-names"), "{bad}");
    }

    #[test]
    fn a_secret_is_store_credentials_only_when_it_carries_the_label() {
        let labelled = map(&[(CREDENTIALS_LABEL, "true")]);
        assert!(secret_consents("t/sandboxrun-store", "t", "creds", Some(&labelled)).is_ok());
        for labels in [
            None,
            Some(map(&[])),
            Some(map(&[("app", "db")])),
            Some(map(&[(CREDENTIALS_LABEL, "false")])),
            Some(map(&[(CREDENTIALS_LABEL, "True")])),
        ] {
            let refused =
                secret_consents("t/sandboxrun-store", "t", "db-password", labels.as_ref())
                    .expect_err("no consent")
                    .to_string();
            assert!(
                refused.contains("t/sandboxrun-store")
                    && refused.contains("t/db-password")
                    && refused.contains(&format!("{CREDENTIALS_LABEL}=true")),
                "{labels:?}: {refused}"
            );
        }
    }

    #[test]
    fn a_missing_url_key_is_refused_by_name() {
        let on = endpoints(&["*.amazonaws.com"]);
        let err = tenant_store("t/s", &map(&[("secretName", "c")]), &s3_secret(), &on)
            .expect_err("no url");
        assert!(err.to_string().contains("no \"url\" key"), "{err}");
    }

    /// Stands in for a private key in the pure tests (never parsed here).
    const KEY_MATERIAL: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDtenantsecret";

    /// A service-account key as Google issues it, with `extra` fields set (a `null` removes one).
    fn gcs_key(extra: serde_json::Value) -> String {
        let mut key = serde_json::json!({
            "type": "service_account",
            "project_id": "team-a",
            "private_key_id": "0123abcd",
            "private_key": format!("-----BEGIN PRIVATE KEY-----\n{KEY_MATERIAL}\n-----END PRIVATE KEY-----\n"),
            "client_email": "runs@team-a.iam.gserviceaccount.com",
            "client_id": "1234",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": "https://oauth2.googleapis.com/token",
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/runs",
            "universe_domain": "googleapis.com",
        });
        for (k, v) in extra.as_object().expect("object") {
            if v.is_null() {
                key.as_object_mut().expect("object").remove(k);
            } else {
                key[k] = v.clone();
            }
        }
        key.to_string()
    }

    fn gcs_store(
        key: &str,
        options: &str,
        policy: &[&str],
    ) -> Result<TenantStore, TenantStoreError> {
        let cm = map(&[("url", "gs://team-a-runs/p"), ("options", options)]);
        let secret = map(&[("GOOGLE_SERVICE_ACCOUNT_KEY", key)]);
        tenant_store("team/sandboxrun-store", &cm, &secret, &endpoints(policy))
    }

    #[test]
    fn a_tenant_gcs_store_signs_with_its_key_and_every_url_of_the_key_must_be_allowed() {
        use serde_json::json;
        let google = ["storage.googleapis.com", "oauth2.googleapis.com"];
        let bed = ["http://127.0.0.1:19100"];
        let local = json!({"gcs_base_url": "http://127.0.0.1:19100/", "token_uri": "http://127.0.0.1:19100/token"});
        // (the key's extra fields, the allowed endpoints, Ok(the store's endpoint) or Err(the
        // endpoint refused)).
        let cases: [(serde_json::Value, &[&str], Result<&str, &str>); 7] = [
            // A key as Google issues it: the defaults are judged, both must be allowed.
            (json!({}), &google, Ok("https://storage.googleapis.com")),
            (
                json!({"token_uri": null}),
                &google,
                Ok("https://storage.googleapis.com"),
            ),
            (
                json!({}),
                &["storage.googleapis.com"],
                Err("https://oauth2.googleapis.com/token"),
            ),
            (
                json!({"token_uri": null}),
                &["oauth2.googleapis.com"],
                Err("https://storage.googleapis.com"),
            ),
            // The bed's server named by the key, allowed as a URL prefix.
            (local.clone(), &bed, Ok("http://127.0.0.1:19100")),
            // A key sending its token request, or every request, elsewhere.
            (
                json!({"token_uri": "https://collector.evil.io/token"}),
                &google,
                Err("https://collector.evil.io/token"),
            ),
            (
                json!({"gcs_base_url": "https://storage.googleapis.com.evil.io"}),
                &google,
                Err("https://storage.googleapis.com.evil.io"),
            ),
        ];
        for (extra, policy, expected) in cases {
            let got = gcs_store(&gcs_key(extra.clone()), "allow_http=true", policy);
            match (got, expected) {
                (Ok(store), Ok(endpoint)) => {
                    assert_eq!(store.endpoint, endpoint, "{extra}");
                    let shown = format!("{store:?}");
                    assert!(!shown.contains(KEY_MATERIAL), "{shown}");
                }
                (Err(e @ TenantStoreError::EndpointRefused { .. }), Err(endpoint)) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("team/sandboxrun-store") && text.contains(endpoint),
                        "{extra}: {text}"
                    );
                    assert!(!text.contains(KEY_MATERIAL), "{text}");
                }
                (got, expected) => panic!("{extra}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_gcs_key_that_is_not_a_service_account_s_own_is_refused_by_name_never_echoed() {
        use serde_json::json;
        let google = ["storage.googleapis.com", "oauth2.googleapis.com"];
        let whole = gcs_key(json!({}));
        // (the Secret's key, words the refusal must carry).
        let cases: Vec<(String, &str)> = vec![
            (whole[..whole.len() / 2].to_string(), "is not JSON"),
            (
                whole[..whole.find(KEY_MATERIAL).expect("key") + KEY_MATERIAL.len()].to_string(),
                "is not JSON",
            ),
            (whole.replace("\\n", "\n"), "is not JSON"),
            ("[1, 2]".into(), "not a JSON object"),
            (
                gcs_key(json!({"type": "authorized_user"})),
                "\"authorized_user\"",
            ),
            (
                gcs_key(json!({"type": "external_account"})),
                "not a service account's key",
            ),
            (
                gcs_key(json!({"type": KEY_MATERIAL})),
                "not one Google issues",
            ),
            (gcs_key(json!({"type": null})), "\"type\" is missing"),
            (
                gcs_key(json!({"private_key": null})),
                "lacks \"private_key\"",
            ),
            (
                gcs_key(json!({"private_key": " "})),
                "lacks \"private_key\"",
            ),
            (
                gcs_key(json!({"private_key": KEY_MATERIAL})),
                "not a PEM private key",
            ),
            (
                gcs_key(json!({"client_email": null})),
                "lacks \"client_email\"",
            ),
            (
                gcs_key(json!({"private_key_id": 7})),
                "\"private_key_id\" is not a string",
            ),
            (
                gcs_key(json!({"token_uri": 7})),
                "\"token_uri\" is not a string",
            ),
            (gcs_key(json!({"disable_oauth": true})), "\"disable_oauth\""),
            (
                gcs_key(json!({"universe_domain": "evil.io"})),
                "\"universe_domain\"",
            ),
            // Fields other clients call, and any field outside a service-account key's.
            (
                gcs_key(json!({"service_account_impersonation_url": "https://evil.io"})),
                "\"service_account_impersonation_url\"",
            ),
            (
                gcs_key(json!({"credential_source": {"url": "http://169.254.169.254"}})),
                "\"credential_source\"",
            ),
            (
                gcs_key(json!({"quota_project_id": "x"})),
                "\"quota_project_id\"",
            ),
        ];
        for (key, words) in cases {
            let err = gcs_store(&key, "", &google).expect_err(words);
            assert!(
                matches!(err, TenantStoreError::Invalid { .. }),
                "{words}: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains("team/sandboxrun-store")
                    && text.contains("GOOGLE_SERVICE_ACCOUNT_KEY")
                    && text.contains(words),
                "{words}: {text}"
            );
            assert!(!text.contains(KEY_MATERIAL), "the key is echoed: {text}");
        }
    }

    #[test]
    fn a_gcs_tenant_store_takes_no_key_file_identity_proxy_or_endpoint_option() {
        let google = ["storage.googleapis.com", "oauth2.googleapis.com"];
        let key = gcs_key(serde_json::json!({}));
        for option in [
            "service_account=/var/run/secrets/google/key.json",
            "application_credentials=/root/.config/gcloud/application_default_credentials.json",
            "service_account_key={}",
            "proxy_url=http://proxy",
            "allow_invalid_certificates=true",
            "base_url=https://evil.io",
            "skip_signature=true",
            "bearer_token=x",
        ] {
            let err = gcs_store(&key, option, &google).expect_err(option);
            assert!(
                err.to_string().contains("not one a tenant store may set"),
                "{option}: {err}"
            );
        }
        // No key: refused, never the operator's application-default credentials or metadata
        // server (workload identity).
        let cm = map(&[("url", "gs://b/p")]);
        let err =
            tenant_store("t/s", &cm, &BTreeMap::new(), &endpoints(&google)).expect_err("no key");
        assert!(
            err.to_string().contains("lacks GOOGLE_SERVICE_ACCOUNT_KEY"),
            "{err}"
        );
        for odd in ["GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT"] {
            let secret = map(&[("GOOGLE_SERVICE_ACCOUNT_KEY", &key), (odd, "/key.json")]);
            let err = tenant_store("t/s", &cm, &secret, &endpoints(&google)).expect_err(odd);
            assert!(err.to_string().contains(odd), "{err}");
            assert!(!err.to_string().contains(KEY_MATERIAL), "{err}");
        }
        // A reader (`files`) is held to the same key rules, not to the operator's allowlist.
        let secret = map(&[("GOOGLE_SERVICE_ACCOUNT_KEY", key.as_str())]);
        assert!(for_reader("t/s", &cm, &secret).is_ok());
        let unsigned = map(&[(
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            &gcs_key(serde_json::json!({"disable_oauth": true})),
        )]);
        assert!(for_reader("t/s", &cm, &unsigned).is_err());
    }

    #[test]
    fn a_tenant_azure_store_needs_a_key_or_sas_and_its_account_endpoint_allowed() {
        let cm = map(&[
            ("url", "az://runs/p"),
            (
                "options",
                "endpoint=http://127.0.0.1:19200/acct,allow_http=true",
            ),
        ]);
        let secret = map(&[
            ("AZURE_STORAGE_ACCOUNT_NAME", "acct"),
            ("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"),
        ]);
        let on = endpoints(&["http://127.0.0.1:19200"]);
        let store = tenant_store("t/s", &cm, &secret, &on).expect("azure");
        assert_eq!(store.endpoint, "http://127.0.0.1:19200/acct");
        let name_only = map(&[("AZURE_STORAGE_ACCOUNT_NAME", "acct")]);
        assert!(tenant_store("t/s", &cm, &name_only, &on).is_err());
        let cloud = map(&[("url", "az://runs/p")]);
        let err = tenant_store("t/s", &cloud, &secret, &on).expect_err("not allowed");
        assert!(
            err.to_string()
                .contains("https://acct.blob.core.windows.net"),
            "{err}"
        );
        let emulator = map(&[("url", "az://runs/p"), ("options", "use_emulator=true")]);
        assert!(tenant_store("t/s", &emulator, &secret, &on).is_err());
    }
}
