//! No-pull image resolvability (ADR-006 Decision 1): read only the registry manifest with
//! `HEAD /v2/<repo>/manifests/<ref>`, never a blob. The only non-pure part of admission; opt-in
//! (`doctor --check-images`, webhook `--check-images`).
//!
//! Verdicts follow ADR-006's trade-off table: 200 → resolvable; 404 / `MANIFEST_UNKNOWN` /
//! `NAME_UNKNOWN` → fail; auth, network and timeout errors → *transient* warn, because we cannot
//! prove resolvability from here and the kubelet may still pull with its own credentials.
//!
//! Plain HTTP is used for loopback registries (`localhost`, `127.0.0.0/8`, `::1`) and for the
//! hosts listed in [`ImageSettings::insecure_registries`]; everything else is HTTPS only. We do
//! not "try HTTPS then HTTP": a silent downgrade would make the verdict depend on the network.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use serde::Deserialize;
use thiserror::Error;
use tracing::debug;

/// Docker Hub's name in references, and where its API lives.
const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// Manifest media types we accept: a manifest list / index resolves just as well as a manifest.
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// Tag or digest of a reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reference {
    /// `:tag` (`latest` when the reference names neither).
    Tag(String),
    /// `@algo:hex`.
    Digest(String),
}

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageRef {
    /// Registry as written (`docker.io` when none): `host[:port]`.
    pub registry: String,
    /// Repository path, e.g. `library/alpine`.
    pub repository: String,
    /// Tag or digest (a digest wins when both are written: it is what the runtime pulls).
    pub reference: Reference,
}

/// Why a reference does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum ImageRefError {
    /// Empty reference.
    #[error("the image reference is empty")]
    Empty,
    /// A repository path component is not lowercase `[a-z0-9]` with `.`, `_`, `__`, `-` separators.
    #[error("repository `{0}` is not a valid path (lowercase letters, digits, `.`, `_`, `-`, separated by `/`)")]
    Repository(String),
    /// Tag grammar `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
    #[error("tag `{0}` is not valid")]
    Tag(String),
    /// Digest grammar `algo:hex`.
    #[error("digest `{0}` is not valid (expected sha256:<64 hex>)")]
    Digest(String),
}

impl ImageRef {
    /// Parses a reference the way the container runtime does (Docker's normalization): the first
    /// path component is a registry when it contains `.` or `:` or is `localhost`; otherwise the
    /// registry is `docker.io`, and single-component names get `library/`.
    pub fn parse(image: &str) -> Result<ImageRef, ImageRefError> {
        let image = image.trim();
        if image.is_empty() {
            return Err(ImageRefError::Empty);
        }
        let (name_tag, digest) = match image.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (image, None),
        };
        let last_slash = name_tag.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match name_tag[last_slash..].rfind(':') {
            Some(i) => (
                &name_tag[..last_slash + i],
                Some(&name_tag[last_slash + i + 1..]),
            ),
            None => (name_tag, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_string(), rest.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !valid_repository(&repository) {
            return Err(ImageRefError::Repository(repository));
        }
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && !t.starts_with(['.', '-'])
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !ok {
                return Err(ImageRefError::Tag(t.to_string()));
            }
        }
        let reference = match digest {
            Some(d) => {
                let ok = d.split_once(':').is_some_and(|(algo, hex)| {
                    !algo.is_empty()
                        && algo.bytes().all(|b| {
                            b.is_ascii_lowercase()
                                || b.is_ascii_digit()
                                || matches!(b, b'+' | b'.' | b'_' | b'-')
                        })
                        && hex.len() >= 32
                        && hex
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                        && (algo != "sha256" || hex.len() == 64)
                });
                if !ok {
                    return Err(ImageRefError::Digest(d.to_string()));
                }
                Reference::Digest(d.to_string())
            }
            None => Reference::Tag(tag.unwrap_or("latest").to_string()),
        };
        Ok(ImageRef {
            registry,
            repository,
            reference,
        })
    }

    /// Host (and port) the registry API is served on.
    pub(crate) fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// `/v2/<repo>/manifests/<tag or digest>`.
    pub(crate) fn manifest_path(&self) -> String {
        let r = match &self.reference {
            Reference::Tag(t) | Reference::Digest(t) => t,
        };
        format!("/v2/{}/manifests/{r}", self.repository)
    }

    /// Whether the registry is on loopback (plain HTTP allowed).
    pub(crate) fn is_loopback(&self) -> bool {
        let host = host_without_port(&self.registry);
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

fn host_without_port(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(registry)
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                && c.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                && c.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
        })
}

/// Outcome of a resolvability check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The registry has the manifest.
    Resolvable,
    /// The registry says the manifest or repository does not exist (fail).
    NotFound(String),
    /// Cannot tell: auth, network, timeout, unexpected answer (warn).
    Unknown(String),
}

/// Settings of the resolver.
#[derive(Clone, Debug)]
pub struct ImageSettings {
    /// Bound of one whole check, token exchange included (ADR-006: default 5 s).
    pub timeout: Duration,
    /// Registries (`host[:port]`) reached over plain HTTP besides loopback ones.
    pub insecure_registries: Vec<String>,
    /// How long a definitive answer (found / not found) is reused.
    pub cache_ttl: Duration,
}

impl Default for ImageSettings {
    fn default() -> Self {
        ImageSettings {
            timeout: Duration::from_secs(5),
            insecure_registries: Vec::new(),
            cache_ttl: Duration::from_secs(300),
        }
    }
}

/// Registry credentials from a `.dockerconfigjson` (`{"auths": {"host": {"auth": b64}}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryCredentials {
    by_host: HashMap<String, (String, String)>,
}

/// Why a dockerconfigjson does not parse.
#[derive(Debug, Error)]
pub enum CredentialsError {
    /// Not JSON of the expected shape.
    #[error("not a dockerconfigjson: {0}")]
    Json(#[from] serde_json::Error),
    /// `auth` is not base64 of `user:password`.
    #[error("auth of registry `{0}` is not base64 of user:password")]
    Auth(String),
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl RegistryCredentials {
    /// Parses a `.dockerconfigjson` (or a `~/.docker/config.json` with inline `auths`).
    pub fn from_docker_config(json: &[u8]) -> Result<Self, CredentialsError> {
        let cfg: DockerConfig = serde_json::from_slice(json)?;
        let mut by_host = HashMap::new();
        for (key, a) in cfg.auths {
            let pair = match (a.auth, a.username, a.password) {
                (Some(b64), _, _) => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .map_err(|_| CredentialsError::Auth(key.clone()))?;
                    let text =
                        String::from_utf8(raw).map_err(|_| CredentialsError::Auth(key.clone()))?;
                    let (u, p) = text
                        .split_once(':')
                        .ok_or_else(|| CredentialsError::Auth(key.clone()))?;
                    (u.to_string(), p.to_string())
                }
                (None, Some(u), Some(p)) => (u, p),
                _ => continue,
            };
            by_host.insert(normalize_auth_key(&key), pair);
        }
        Ok(RegistryCredentials { by_host })
    }

    /// Merges another set (later wins).
    pub fn extend(&mut self, other: RegistryCredentials) {
        self.by_host.extend(other.by_host);
    }

    /// Credentials for a registry as written in the reference.
    pub(crate) fn for_registry(&self, registry: &str) -> Option<&(String, String)> {
        self.by_host.get(&normalize_auth_key(registry))
    }
}

/// `https://index.docker.io/v1/` and friends all mean Docker Hub.
fn normalize_auth_key(key: &str) -> String {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            DOCKER_HUB.to_string()
        }
        _ => host,
    }
}

/// Why the resolver cannot be built.
#[derive(Debug, Error)]
#[error("cannot build the registry HTTP client: {0}")]
pub struct ResolverError(#[from] reqwest::Error);

/// Checks image references against their registries, caching definitive answers in-process.
pub struct ImageResolver {
    client: reqwest::Client,
    settings: ImageSettings,
    cache: Mutex<HashMap<String, (Instant, Resolution)>>,
}

impl ImageResolver {
    /// Builds the HTTP client (rustls; the process must have a crypto provider installed).
    pub fn new(settings: ImageSettings) -> Result<Self, ResolverError> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::limited(5))
            .user_agent(concat!("sandboxrun-operator/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(ImageResolver {
            client,
            settings,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `image`'s manifest exists, without pulling. Never errors: an unparseable reference
    /// is `NotFound` (the runtime could not pull it either), anything else uncertain is `Unknown`.
    pub async fn resolve(&self, image: &str, creds: Option<&RegistryCredentials>) -> Resolution {
        let parsed = match ImageRef::parse(image) {
            Ok(r) => r,
            Err(e) => return Resolution::NotFound(e.to_string()),
        };
        let cred = creds
            .and_then(|c| c.for_registry(&parsed.registry))
            .cloned();
        let key = format!(
            "{}|{}|{}",
            parsed.api_host(),
            parsed.manifest_path(),
            cred.as_ref().map(|c| c.0.as_str()).unwrap_or("")
        );
        if let Some(hit) = self.cached(&key) {
            return hit;
        }
        let verdict = match tokio::time::timeout(
            self.settings.timeout,
            self.head_manifest(&parsed, cred.as_ref()),
        )
        .await
        {
            Ok(v) => v,
            Err(_) => Resolution::Unknown(format!(
                "registry {} did not answer within {:?}",
                parsed.api_host(),
                self.settings.timeout
            )),
        };
        debug!(image, ?verdict, "image resolvability");
        if !matches!(verdict, Resolution::Unknown(_)) {
            // Transient answers are not cached: the next check should try again.
            if let Ok(mut cache) = self.cache.lock() {
                cache.insert(key, (Instant::now(), verdict.clone()));
            }
        }
        verdict
    }

    fn cached(&self, key: &str) -> Option<Resolution> {
        let mut cache = self.cache.lock().ok()?;
        match cache.get(key) {
            Some((at, v)) if at.elapsed() < self.settings.cache_ttl => Some(v.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        }
    }

    fn base_url(&self, r: &ImageRef) -> String {
        let insecure = r.is_loopback()
            || self
                .settings
                .insecure_registries
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&r.registry));
        format!(
            "{}://{}",
            if insecure { "http" } else { "https" },
            r.api_host()
        )
    }

    async fn head_manifest(&self, r: &ImageRef, cred: Option<&(String, String)>) -> Resolution {
        let url = format!("{}{}", self.base_url(r), r.manifest_path());
        let first = match self.send_head(&url, None).await {
            Ok(resp) => resp,
            Err(e) => return Resolution::Unknown(network_error(&e)),
        };
        let resp = if first.status() == StatusCode::UNAUTHORIZED {
            // The registry challenges: fetch a token (anonymously, or with the pull secret's basic
            // credentials) and try once more.
            let challenge = first
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let auth = match challenge.as_deref().map(parse_challenge) {
                Some(Some(Challenge::Bearer {
                    realm,
                    service,
                    scope,
                })) => {
                    let scope =
                        scope.unwrap_or_else(|| format!("repository:{}:pull", r.repository));
                    match self
                        .fetch_token(&realm, service.as_deref(), &scope, cred)
                        .await
                    {
                        Ok(token) => format!("Bearer {token}"),
                        Err(why) => return Resolution::Unknown(why.to_string()),
                    }
                }
                Some(Some(Challenge::Basic)) => match cred {
                    Some((u, p)) => basic(u, p),
                    None => {
                        return Resolution::Unknown(
                            "the registry requires credentials and none were given".into(),
                        )
                    }
                },
                _ => {
                    return Resolution::Unknown(
                        "the registry answered 401 without a usable challenge".into(),
                    )
                }
            };
            match self.send_head(&url, Some(&auth)).await {
                Ok(resp) => resp,
                Err(e) => return Resolution::Unknown(network_error(&e)),
            }
        } else {
            first
        };
        match resp.status() {
            s if s.is_success() => Resolution::Resolvable,
            StatusCode::NOT_FOUND => Resolution::NotFound(format!(
                "{} answered 404 for {}",
                r.api_host(),
                r.manifest_path()
            )),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Resolution::Unknown(format!(
                "{} refused access ({}); a private repository needs a pull secret",
                r.api_host(),
                resp.status()
            )),
            other => self.classify_by_body(&url, other).await,
        }
    }

    /// HEAD has no body; for an unexpected status, GET the manifest once to read the registry's
    /// error codes (`MANIFEST_UNKNOWN`, `NAME_UNKNOWN` mean "does not exist").
    async fn classify_by_body(&self, url: &str, status: StatusCode) -> Resolution {
        let resp = match self.client.get(url).headers(accept_headers()).send().await {
            Ok(r) => r,
            Err(e) => return Resolution::Unknown(network_error(&e)),
        };
        let body = resp.text().await.unwrap_or_default();
        if body.contains("MANIFEST_UNKNOWN") || body.contains("NAME_UNKNOWN") {
            return Resolution::NotFound(format!(
                "the registry answered {status} with {}",
                first_error_code(&body)
            ));
        }
        Resolution::Unknown(format!("unexpected registry answer {status}"))
    }

    async fn send_head(
        &self,
        url: &str,
        auth: Option<&str>,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut headers = accept_headers();
        if let Some(a) = auth.and_then(|a| HeaderValue::from_str(a).ok()) {
            headers.insert(AUTHORIZATION, a);
        }
        self.client.head(url).headers(headers).send().await
    }

    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        cred: Option<&(String, String)>,
    ) -> Result<String, TokenError> {
        let mut query = vec![("scope", scope)];
        if let Some(s) = service {
            query.push(("service", s));
        }
        let url =
            url::Url::parse_with_params(realm, &query).map_err(|source| TokenError::Realm {
                realm: realm.to_string(),
                source,
            })?;
        let mut req = self.client.get(url);
        if let Some((u, p)) = cred {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| TokenError::Network(network_error(&e)))?;
        if !resp.status().is_success() {
            return Err(TokenError::Refused(resp.status()));
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| TokenError::Network(network_error(&e)))?;
        let t: Token = serde_json::from_slice(&body).map_err(TokenError::Garbage)?;
        t.token.or(t.access_token).ok_or(TokenError::NoToken)
    }
}

/// Why a registry's token service gave no token (the resolution is then unknown, with these
/// words).
#[derive(Debug, thiserror::Error)]
enum TokenError {
    /// The challenge's realm is not a URL.
    #[error("the token realm `{realm}` is not a URL: {source}")]
    Realm {
        /// The realm.
        realm: String,
        /// Why.
        #[source]
        source: url::ParseError,
    },
    /// The request failed on the way (its words).
    #[error("{0}")]
    Network(String),
    /// The service answered with an error status.
    #[error("the token service refused a token ({0})")]
    Refused(reqwest::StatusCode),
    /// The answer is not the token JSON.
    #[error("the token service answered garbage: {0}")]
    Garbage(#[source] serde_json::Error),
    /// No token in the answer.
    #[error("the token service returned no token")]
    NoToken,
}

fn accept_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(ACCEPT, HeaderValue::from_static(MANIFEST_ACCEPT));
    h
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn network_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "the registry timed out".to_string()
    } else if e.is_connect() {
        format!("cannot connect to the registry: {e}")
    } else {
        format!("registry request failed: {e}")
    }
}

fn first_error_code(body: &str) -> String {
    #[derive(Deserialize)]
    struct Errors {
        errors: Vec<ErrorItem>,
    }
    #[derive(Deserialize)]
    struct ErrorItem {
        code: String,
    }
    serde_json::from_str::<Errors>(body)
        .ok()
        .and_then(|e| e.errors.into_iter().next())
        .map(|e| e.code)
        .unwrap_or_else(|| "an error".to_string())
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// `Bearer realm="…",service="…",scope="…"`.
    Bearer {
        /// Token endpoint.
        realm: String,
        /// `service` parameter.
        service: Option<String>,
        /// `scope` parameter.
        scope: Option<String>,
    },
    /// `Basic realm="…"`.
    Basic,
}

/// Parses a `WWW-Authenticate` header value (Bearer or Basic).
pub(crate) fn parse_challenge(value: &str) -> Option<Challenge> {
    let (scheme, params) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut map = HashMap::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (val, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            after.split_once(',').unwrap_or((after, ""))
        };
        map.insert(key.trim().to_ascii_lowercase(), val.to_string());
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: map.remove("realm")?,
        service: map.remove("service"),
        scope: map.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn docker_hub_short_names_are_normalized() {
        let r = parse("alpine");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "library/alpine")
        );
        assert_eq!(r.reference, Reference::Tag("latest".into()));
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.manifest_path(), "/v2/library/alpine/manifests/latest");
        let r = parse("bitnami/redis:7.2");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "bitnami/redis")
        );
        assert_eq!(r.reference, Reference::Tag("7.2".into()));
        assert_eq!(parse("docker.io/alpine:3").repository, "library/alpine");
    }

    #[test]
    fn registry_hosts_ports_and_digests_are_recognized() {
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = parse(&format!("ghcr.io/acme/tools/cli:1.0@{d}"));
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("ghcr.io", "acme/tools/cli")
        );
        assert_eq!(r.reference, Reference::Digest(d.clone()));
        let r = parse("localhost:5000/team/app:dev");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "team/app")
        );
        assert!(r.is_loopback());
        assert!(parse("127.0.0.1:5000/app").is_loopback());
        assert!(parse("[::1]:5000/app").is_loopback());
        assert!(!parse("ghcr.io/app").is_loopback());
        assert_eq!(parse("localhost/app").registry, "localhost");
        assert_eq!(
            parse("myhost:5000/app").manifest_path(),
            "/v2/app/manifests/latest"
        );
    }

    #[test]
    fn malformed_references_are_refused() {
        assert_eq!(ImageRef::parse(""), Err(ImageRefError::Empty));
        assert!(matches!(
            ImageRef::parse("Alpine"),
            Err(ImageRefError::Repository(_))
        ));
        assert!(matches!(
            ImageRef::parse("a//b"),
            Err(ImageRefError::Repository(_))
        ));
        assert!(matches!(
            ImageRef::parse("alpine:"),
            Err(ImageRefError::Tag(_))
        ));
        assert!(matches!(
            ImageRef::parse("alpine:-x"),
            Err(ImageRefError::Tag(_))
        ));
        assert!(matches!(
            ImageRef::parse("alpine@sha256:abc"),
            Err(ImageRefError::Digest(_))
        ));
        assert!(matches!(
            ImageRef::parse("alpine@latest"),
            Err(ImageRefError::Digest(_))
        ));
    }

    #[test]
    fn challenges_parse() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/alpine:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(
            parse_challenge(r#"Bearer service="x""#),
            None,
            "a bearer challenge needs a realm"
        );
    }

    #[test]
    fn docker_config_credentials_are_found_by_registry() {
        let json = br#"{"auths":{
            "https://index.docker.io/v1/":{"auth":"dXNlcjpwYXNz"},
            "ghcr.io":{"username":"bot","password":"tok"},
            "quay.io":{}
        }}"#;
        let c = RegistryCredentials::from_docker_config(json).unwrap_or_default();
        assert_eq!(
            c.for_registry("docker.io"),
            Some(&("user".to_string(), "pass".to_string()))
        );
        assert_eq!(
            c.for_registry("ghcr.io"),
            Some(&("bot".to_string(), "tok".to_string()))
        );
        assert_eq!(c.for_registry("quay.io"), None);
        assert!(
            RegistryCredentials::from_docker_config(br#"{"auths":{"x":{"auth":"!!"}}}"#).is_err()
        );
        assert!(RegistryCredentials::from_docker_config(b"nope").is_err());
    }
}
