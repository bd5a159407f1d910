//! What the operator serves besides the controller: the admission webhook, its published
//! settings (for `doctor --context`), and metrics with the health probes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use kube::Client;
use tracing::{info, warn};

use super::durations::Durations;
use super::error::OperatorError;
use crate::cmd::run::RunArgs;
use crate::metrics::Metrics;

/// Starts the admission webhook on `--webhook-addr` (none when it is empty).
pub(super) async fn start_webhook(
    args: &RunArgs,
    client: Client,
    metrics: &Metrics,
    (settings, stamp_key): (
        crate::policy::RuleSettings,
        Option<crate::policy::stamp::StampKey>,
    ),
    tenant_stores: crate::store::tenant::TenantStorePolicy,
) -> Result<(), OperatorError> {
    if args.webhook_addr.trim().is_empty() {
        return Ok(());
    }
    let cfg = crate::admission::serve::ServeConfig {
        addr: args.webhook_addr.parse().map_err(|e| {
            OperatorError::Config(format!("--webhook-addr {:?}: {e}", args.webhook_addr))
        })?,
        cert_mode: args.webhook_cert_mode.clone(),
        cert_dir: args.webhook_cert_dir.clone(),
        client_ca: args.webhook_client_ca.clone(),
        secret: args.webhook_secret.clone(),
        namespace: args.pod_namespace.clone(),
        config: args.webhook_config.clone(),
        hosts: args.webhook_hosts.clone(),
        check_images: args.check_images,
        shards: args.sharding.then_some(args.shards),
        stamp_key,
        platform_pull: crate::policy::platform_pull::PlatformPull::new(
            &args.pod_image_pull_secrets,
            &args.holder_image,
            args.pod_image_pull_secret_serves_workloads,
        ),
        tenant_stores,
        settings,
        external_metrics: args.external_metrics.then(|| args.namespaces.clone()),
        api_service: args.external_metrics_api_service.clone(),
        front_proxy_ca: None,
        watched_namespaces: if args.webhook_refuse_unwatched {
            args.namespaces.clone()
        } else {
            Vec::new()
        },
    };
    let addr = crate::admission::serve::start(&cfg, client, metrics).await?;
    info!(%addr, "admission webhook listening");
    Ok(())
}

/// Publishes the operator's settings in `--settings-configmap` (unless empty), for `doctor
/// --context`, from now on (a heartbeat while `ready`).
pub(super) fn publish_settings(
    args: &RunArgs,
    client: Client,
    (rules, tenant_stores): (
        crate::policy::RuleSettings,
        crate::store::tenant::TenantStorePolicy,
    ),
    durations: &Durations,
    ready: &Arc<AtomicBool>,
) {
    if args.settings_configmap.trim().is_empty() {
        return;
    }
    let published = crate::policy::published::PublishedSettings {
        rules,
        default_drain_timeout: durations.drain_timeout,
        drain_wire: args.drain_wire,
        image_pull_timeout: durations.image_pull_timeout,
        check_images: args.check_images,
        preflight_images: args.preflight_images,
        webhook: !args.webhook_addr.trim().is_empty(),
        pod: args.pod_name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        heartbeat: None,
        watched_namespaces: args.namespaces.clone(),
        tenant_stores: Some(tenant_stores),
    };
    tokio::spawn(crate::admission::publish::publish_forever(
        client,
        args.pod_namespace.clone(),
        args.settings_configmap.trim().to_string(),
        published,
        ready.clone(),
    ));
}

#[derive(Clone)]
struct HealthState {
    metrics: Metrics,
    ready: Arc<AtomicBool>,
}

pub(super) async fn serve_metrics(
    addr: &str,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
) -> Result<SocketAddr, OperatorError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| OperatorError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| OperatorError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<HealthState>| async move { s.metrics.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<HealthState>| async move {
                if s.ready.load(Ordering::SeqCst) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .with_state(HealthState { metrics, ready });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(local)
}
