//! Starts the webhook for `sandboxrun-operator run`: certificates (self-managed in a Secret, or
//! mounted files), the TLS listener, and the rotation loop. Thin wiring of [`super::certs`] and
//! [`super::webhook`]; the logic lives there.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum_server::tls_rustls::RustlsConfig;
use axum_server::Handle;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::{Api, Client};
use tracing::{debug, error, warn};

use super::certs::{self, CertBundle};
use super::webhook::{router, WebhookMetrics, WebhookState};
use crate::metrics::Metrics;
use crate::policy::rules::RuleSettings;
use crate::registry::{ImageResolver, ImageSettings};

/// Lifetime of a self-managed serving certificate (the CA lives twice as long).
const CERT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// Re-issue this long before expiry.
const ROTATE_BEFORE: Duration = Duration::from_secs(30 * 86_400);
/// How often the certificates and the caBundle are re-examined (a GET of the Secret and of the
/// configuration). Short, because the configuration may be created after the operator starts, or
/// re-applied without a caBundle: until it is patched, a `failurePolicy: Fail` webhook refuses
/// every SandboxRun.
const ROTATION_CHECK: Duration = Duration::from_secs(30);

/// What the webhook needs from the `run` flags (`--webhook-*`, `--check-images`, the caps).
#[derive(Clone, Debug)]
pub(crate) struct ServeConfig {
    /// Listen address.
    pub(crate) addr: SocketAddr,
    /// `self-managed` or `files`.
    pub(crate) cert_mode: String,
    /// Directory with tls.crt / tls.key (mode `files`).
    pub(crate) cert_dir: std::path::PathBuf,
    /// Secret holding the self-managed certificates.
    pub(crate) secret: String,
    /// Namespace of that Secret (the operator's).
    pub(crate) namespace: String,
    /// ValidatingWebhookConfiguration whose caBundle is patched.
    pub(crate) config: String,
    /// DNS names / IPs of the serving certificate.
    pub(crate) hosts: Vec<String>,
    /// Opt-in image resolvability check.
    pub(crate) check_images: bool,
    /// The platform's pull Secrets and the registry they serve (`run --pod-image-pull-secret`).
    pub(crate) platform_pull: crate::policy::platform_pull::PlatformPull,
    /// Settings the rules read.
    pub(crate) settings: RuleSettings,
    /// The tenant store rules (`run --tenant-store-endpoints`, `--tenant-store-secret-names`).
    pub(crate) tenant_stores: crate::store::tenant::TenantStorePolicy,
    /// The namespaces the controller watches (`run --namespaces`); empty: every namespace.
    pub(crate) watched_namespaces: Vec<String>,
    /// `run --shards` when the operator runs sharded (`--sharding`).
    pub(crate) shards: Option<u32>,
    /// The admission stamps' key (`crate::policy::stamp`); None: nothing is stamped.
    pub(crate) stamp_key: Option<crate::policy::stamp::StampKey>,
    /// The CA whose client certificates alone may call the webhook (`run --webhook-client-ca`,
    /// [`super::client_auth`]); None: any TLS client.
    pub(crate) client_ca: Option<std::path::PathBuf>,
    /// Serve the external metrics API (`run --external-metrics`, [`crate::external_metrics`]) for the
    /// pools of these namespaces (empty: every namespace); None: not served.
    pub(crate) external_metrics: Option<Vec<String>>,
    /// The APIService whose caBundle the self-managed mode patches when the metrics are served.
    pub(crate) api_service: String,
    /// The requestheader CA the listener trusts too (read at start with the metrics).
    pub(crate) front_proxy_ca: Option<Vec<u8>>,
}

/// Why the webhook does not start (the operator stops at start).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Its metrics cannot be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The image check's client cannot be built.
    #[error(transparent)]
    Resolver(#[from] crate::registry::ResolverError),
    /// Its certificates cannot be made or read.
    #[error("webhook certificates in secret {namespace}/{secret}: {source}")]
    Certificates {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret.
        secret: String,
        /// Why.
        #[source]
        source: certs::CertError,
    },
    /// The TLS configuration does not take them.
    #[error("TLS configuration: {0}")]
    Tls(#[from] super::client_auth::TlsConfigError),
    /// The client CA file cannot be read.
    #[error("cannot read the webhook's client CA {path}: {source}")]
    ClientCa {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate files cannot be loaded.
    #[error("cannot load {crt} / {key}: {source}")]
    CertFiles {
        /// The certificate file.
        crt: String,
        /// The key file.
        key: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `--webhook-cert-mode` is neither mode.
    #[error("--webhook-cert-mode {0:?}: expected self-managed or files")]
    CertMode(String),
    /// The external metrics cannot be served.
    #[error("external metrics: {0}")]
    MetricsApi(#[from] crate::external_metrics::serve::MetricsApiError),
    /// The server never listened.
    #[error("cannot listen on {0}")]
    NotListening(SocketAddr),
}

/// Starts the webhook in the background; returns the address it listens on.
pub(crate) async fn start(
    config: &ServeConfig,
    client: Client,
    metrics: &Metrics,
) -> Result<SocketAddr, ServeError> {
    let metrics_api = match &config.external_metrics {
        None => None,
        Some(namespaces) => {
            Some(crate::external_metrics::serve::MetricsApi::start(&client, namespaces).await?)
        }
    };
    let config = &ServeConfig {
        front_proxy_ca: metrics_api.as_ref().map(|m| m.front_proxy_ca().to_vec()),
        ..config.clone()
    };
    let addr = config.addr;
    let webhook_metrics = WebhookMetrics::register(&metrics.registry)?;
    let images = if config.check_images {
        Some(Arc::new(ImageResolver::new(ImageSettings::default())?))
    } else {
        None
    };
    let state = WebhookState {
        settings: config.settings.clone(),
        watched_namespaces: config.watched_namespaces.clone(),
        metrics: Some(webhook_metrics),
        images,
        client: Some(client.clone()),
        access_checks: true,
        tenant_stores: config.tenant_stores.clone(),
        shards: config.shards,
        stamp_key: config.stamp_key.clone(),
        platform_pull: config.platform_pull.clone(),
    };

    let tls = match config.cert_mode.as_str() {
        "self-managed" => {
            let bundle = ensure(config, &client).await?;
            let tls =
                RustlsConfig::from_config(tls_config(config, &bundle.cert_pem, &bundle.key_pem)?);
            tokio::spawn(rotate_self_managed(config.clone(), client, tls.clone()));
            tls
        }
        "files" => {
            let tls = RustlsConfig::from_config(tls_from_files(config)?);
            // cert-manager renews the files in place (and the client CA may rotate): pick them up.
            let (reload, config) = (tls.clone(), config.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(300)).await;
                    match tls_from_files(&config) {
                        Ok(fresh) => reload.reload_from_config(fresh),
                        Err(e) => warn!(error = %e, "cannot reload webhook certificate files"),
                    }
                }
            });
            tls
        }
        other => return Err(ServeError::CertMode(other.to_string())),
    };

    let handle: Handle<SocketAddr> = Handle::new();
    let server = axum_server::bind_rustls(addr, tls).handle(handle.clone());
    let app = match metrics_api {
        None => router(state),
        Some(api) => router(state).merge(crate::external_metrics::serve::routes(api)),
    };
    tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            error!(error = %e, "admission webhook server stopped");
        }
    });
    handle
        .listening()
        .await
        .ok_or(ServeError::NotListening(addr))
}

/// The listener's TLS configuration: this serving certificate and key, and the client CA of
/// `--webhook-client-ca` when set (read again each time, so a rotated CA is picked up).
fn tls_config(
    config: &ServeConfig,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let ca = match &config.client_ca {
        None => None,
        Some(path) => Some(std::fs::read(path).map_err(|source| ServeError::ClientCa {
            path: path.display().to_string(),
            source,
        })?),
    };
    Ok(super::client_auth::server_config(
        cert_pem.as_bytes(),
        key_pem.as_bytes(),
        ca.as_deref(),
        config.front_proxy_ca.as_deref(),
    )?)
}

/// [`tls_config`] of the certificate files in `--webhook-cert-dir` (mode `files`).
fn tls_from_files(config: &ServeConfig) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let (crt, key) = (
        config.cert_dir.join("tls.crt"),
        config.cert_dir.join("tls.key"),
    );
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|source| ServeError::CertFiles {
            crt: crt.display().to_string(),
            key: key.display().to_string(),
            source,
        })
    };
    tls_config(config, &read(&crt)?, &read(&key)?)
}

async fn ensure(r: &ServeConfig, client: &Client) -> Result<CertBundle, ServeError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &r.namespace);
    let bundle = certs::ensure_secret(
        &secrets,
        &r.secret,
        &r.namespace,
        &r.hosts,
        SystemTime::now(),
        CERT_VALIDITY,
        ROTATE_BEFORE,
    )
    .await
    .map_err(|source| ServeError::Certificates {
        namespace: r.namespace.clone(),
        secret: r.secret.clone(),
        source,
    })?;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    // The configuration may be installed after the operator (or by hand): not fatal, the next
    // rotation check patches it.
    if let Err(e) = certs::patch_ca_bundle(&configs, &r.config, &bundle.ca_cert_pem).await {
        warn!(config = %r.config, error = %e, "cannot patch the webhook caBundle");
    }
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    if let Err(e) = certs::patch_mutating_ca_bundle(&mutating, &r.config, &bundle.ca_cert_pem).await
    {
        warn!(config = %r.config, error = %e, "cannot patch the mutating webhook's caBundle");
    }
    if config_serves_metrics(r) {
        let services: Api<APIService> = Api::all(client.clone());
        if let Err(e) =
            certs::patch_api_service_ca_bundle(&services, &r.api_service, &bundle.ca_cert_pem).await
        {
            warn!(apiservice = %r.api_service, error = %e, "cannot patch the APIService's caBundle");
        }
    }
    Ok(bundle)
}

fn config_serves_metrics(r: &ServeConfig) -> bool {
    r.external_metrics.is_some() && !r.api_service.is_empty()
}

async fn rotate_self_managed(r: ServeConfig, client: Client, tls: RustlsConfig) {
    loop {
        tokio::time::sleep(ROTATION_CHECK).await;
        match ensure(&r, &client).await {
            Ok(b) => match tls_config(&r, &b.cert_pem, &b.key_pem) {
                Ok(fresh) => {
                    tls.reload_from_config(fresh);
                    debug!("webhook certificate checked");
                }
                Err(e) => warn!(error = %e, "cannot reload the webhook certificate"),
            },
            Err(e) => warn!(error = %e, "webhook certificate rotation failed; retrying later"),
        }
    }
}
