//! `sandboxrun-operator run`, the operating part: wires the client, the store, metrics/health,
//! the admission webhook, leader election and the controller together (the flags are
//! [`super::run`]). By concern: this file (the settings from the flags, the context, which mode
//! runs, the controller's end: [`lifecycle`]), [`elected`] (`--leader-elect`), [`sharded`] (`--sharding`),
//! [`serve`] (the webhook, the published settings, metrics and health).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kube::Client;
use std::process::ExitCode;
use tracing::{error, info, warn};

use super::run::{
    caps, default_runtime_class, drain_bandwidth, egress_settings, holder_resources,
    namespace_policies, RunArgs,
};
use crate::controller::run::decide::DecideSettings;
use crate::controller::Context;
use crate::metrics::Metrics;
use crate::pod::PodSettings;
use crate::process::shutdown_signal;

mod durations;
mod elected;
mod error;
mod lifecycle;
mod serve;
mod sharded;

use durations::Durations;
pub(crate) use error::{HolderProgramError, OperatorError};
use lifecycle::run_controller;

use elected::run_elected;
use serve::{publish_settings, serve_metrics, start_webhook};
use sharded::{drain_claims, run_sharded};

/// The pod builder's settings that come straight from the flags (the holder's resources, the
/// egress settings and the namespace policies are set by the caller, which checked them first).
fn pod_settings(args: &RunArgs, durations: &Durations) -> Result<PodSettings, OperatorError> {
    Ok(PodSettings {
        holder_image: args.holder_image.clone(),
        holder_binary: args.holder_binary.clone(),
        default_drain_timeout_seconds: i64::try_from(durations.drain_timeout.as_secs().max(1))
            .unwrap_or(300),
        max_drain_timeout_seconds: i64::try_from(durations.max_drain_timeout.as_secs().max(1))
            .unwrap_or(i64::MAX),
        image_pull_secrets: args.pod_image_pull_secrets.clone(),
        image_pull_secrets_serve_workloads: args.pod_image_pull_secret_serves_workloads,
        default_runtime_class: default_runtime_class(args)?,
        ..PodSettings::default()
    })
}

/// Runs `run`: logs set up from the flags, then the operator until SIGTERM.
pub(crate) async fn main(args: RunArgs) -> ExitCode {
    args.log.init_tracing();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "operator stopped");
            ExitCode::from(1)
        }
    }
}

/// Runs the operator until SIGTERM.
pub(crate) async fn run(args: RunArgs) -> Result<(), OperatorError> {
    // Checked before anything connects: a bad value is a startup error, not a pod every run fails.
    let holder_resources = holder_resources(&args)?;
    let bandwidth = drain_bandwidth(&args)?;
    // The metrics first: the shard gate keeps the shards-owned gauge.
    let metrics = Metrics::new()?;
    let shards = sharding(&args, &metrics)?;
    let egress = with_proxy_address(egress_settings(&args)?).await;
    let client = Client::try_default().await?;
    let caps = caps(&args)?;
    let options = args.store.options()?;
    let (store, store_prefix) = crate::store::store_from_url(&args.store.store_url, &options)?;
    let open_uploads = open_uploads_cleaner(&args.store.store_url, &options);
    let durations = Durations::parse(&args)?;
    let pack_command = holder_programs(&args.holder_binary, args.pack_command.as_deref())?;
    register_open_uploads(&metrics, open_uploads.as_deref());
    let ready = Arc::new(AtomicBool::new(false));

    let metrics_addr = serve_metrics(&args.metrics_addr, metrics.clone(), ready.clone()).await?;
    info!(%metrics_addr, "metrics and health endpoints listening");

    let namespace_policies = namespace_policies(&args)?;
    let rules = rule_settings(&args, caps, &durations, &egress, &namespace_policies);
    let tenant = tenant_stores(&args)?;
    let rights = rights_policy(&args, &client).await;
    start_webhook(
        &args,
        client.clone(),
        &metrics,
        (rules.clone(), rights.key.clone()),
        tenant.clone(),
    )
    .await?;
    publish_settings(
        &args,
        client.clone(),
        (rules.clone(), tenant.clone()),
        &durations,
        &ready,
    );
    let preflight = preflight(&args)?;
    let leader = metrics.leader.clone();
    let proxy_pods = proxy_pods(&client, &egress);
    let pod = PodSettings {
        holder_resources,
        egress,
        namespace_policies,
        shards: shards.as_ref().map(|gate| gate.shards()),
        ..pod_settings(&args, &durations)?
    };
    let ctx = Context::new(
        client.clone(),
        store,
        store_prefix,
        args.store.store_url.clone(),
        pod,
        caps,
        DecideSettings {
            image_pull_timeout: durations.image_pull_timeout,
        },
        pack_command,
        metrics,
        args.pod_name.clone(),
        usize::from(args.max_concurrent_drains),
    );
    let ctx = with_drain_flags(ctx, &args, &durations, bandwidth)
        .with_open_uploads(open_uploads)
        .with_tenant_stores(tenant)
        .with_preflight(preflight)
        .with_rules(rules)
        .with_rights(rights)
        .with_shards(shards.clone())
        .with_drain_claims(shards.as_ref().map(|_| drain_claims(&args, &client)))
        .with_max_checkpoints(args.max_checkpoints)
        .with_egress_proxy(proxy_pods);
    operate(&args, client, Arc::new(ctx), &ready, leader).await
}

/// `egress` with the proxy's address: its URL's host as written when that is an address, else
/// what the name resolves to now (its Service's cluster IP; within 5 s). The anchor of the gate
/// of a run that may reach nothing, which has no DNS (`EgressSettings::deny_all_anchor`); a name
/// that does not resolve leaves such runs the plain probe (said in the log).
async fn with_proxy_address(
    mut egress: crate::egress::EgressSettings,
) -> crate::egress::EgressSettings {
    let anchored = egress.gate.as_ref().is_some_and(|g| g.anchor)
        && egress
            .proxy
            .as_ref()
            .is_some_and(|p| p.canary_port.is_some());
    if egress.gate.is_some() && !anchored {
        warn!("the egress gate has no anchor and canary (no egress proxy with a canary port, or --egress-gate-anchor off): a closed or firewalled probe port reads as a policy in force (docs/contract.md \"A filtered run never has an unfiltered instant\")");
    }
    let Some(proxy) = egress.proxy.as_mut() else {
        return egress;
    };
    let host = url::Url::parse(&proxy.url)
        .ok()
        .and_then(|u| u.host().map(|h| h.to_owned()));
    proxy.address = match host {
        Some(url::Host::Ipv4(a)) => Some(a.into()),
        Some(url::Host::Ipv6(a)) => Some(a.into()),
        Some(url::Host::Domain(name)) => {
            let lookup = tokio::net::lookup_host((name.as_str(), proxy.port));
            let found = tokio::time::timeout(std::time::Duration::from_secs(5), lookup).await;
            let address = found.ok().and_then(|r| r.ok()).and_then(|mut a| a.next());
            if address.is_none() {
                warn!(proxy = %name, "the egress proxy's name did not resolve: runs that may reach nothing have no gate anchor");
            }
            address.map(|a| a.ip())
        }
        None => None,
    };
    egress
}

/// The egress proxy's pods, watched when runs' gates probe its canary: their addresses are
/// denied to a run while its gate waits (docs/contract.md "A filtered run never has an
/// unfiltered instant").
fn proxy_pods(
    client: &Client,
    egress: &crate::egress::EgressSettings,
) -> crate::egress::proxy_pods::ProxyPods {
    match &egress.proxy {
        Some(proxy) if egress.gate.is_some() && proxy.canary_port.is_some() => {
            crate::egress::proxy_pods::ProxyPods::watch(client.clone(), &proxy.selector)
        }
        _ => crate::egress::proxy_pods::ProxyPods::default(),
    }
}

/// `ctx` with the drain settings taken from the flags and the durations [`run`] parsed.
fn with_drain_flags(
    ctx: Context,
    args: &RunArgs,
    durations: &Durations,
    bandwidth: crate::drain::bandwidth::DrainBandwidth,
) -> Context {
    ctx.with_default_retention(args.default_retention)
        .with_drain_wire(args.drain_wire)
        .with_drain_idle(durations.drain_idle)
        .with_drain_bandwidth(bandwidth)
        .with_quiet_window(durations.quiet_window)
        .with_kueue(args.kueue)
        .with_warm_pools(args.warm_pools)
        .with_path_slots(args.path_slots())
}

/// The rules the webhook, `doctor --context` (the published settings) and the controller judge
/// runs by (docs/contract.md "The operator never builds a pod its own rules refuse").
fn rule_settings(
    args: &RunArgs,
    caps: crate::caps::CapSettings,
    durations: &Durations,
    egress: &crate::egress::EgressSettings,
    namespace_policies: &[crate::policy::namespace_policy::Compiled],
) -> crate::policy::RuleSettings {
    crate::policy::RuleSettings {
        caps,
        max_drain_timeout: Some(durations.max_drain_timeout),
        network_policy: egress.enforcement,
        policy: args.run_policy(),
        namespace_policies: namespace_policies.to_vec(),
    }
}

/// The admission stamps (docs/contract.md "A run uses only its author's rights"): what the
/// controller does without one, and the key, read (or created) when the webhook stamps or the
/// controller checks. A key that cannot be had is logged: the webhook then stamps nothing and
/// the controller holds every run that needs a stamp (fail closed).
async fn rights_policy(args: &RunArgs, client: &Client) -> crate::policy::stamp::RightsPolicy {
    use crate::policy::stamp::{RightsPolicy, UnadmittedReferences};
    let unadmitted = args.unadmitted_references;
    // Warm pools seal their pods with it too (docs/contract.md "A warm pool's launcher is the
    // operator's code; a pool pod serves one run (issue #39)").
    let needed = unadmitted == UnadmittedReferences::Hold
        || !args.webhook_addr.trim().is_empty()
        || args.warm_pools;
    let key = if needed {
        let (namespace, name) = (&args.pod_namespace, &args.admission_key_secret);
        match crate::policy::stamp_key::load_or_create(client.clone(), namespace, name).await {
            Ok(key) => Some(key),
            Err(e) => {
                error!(error = %e, "no admission key: runs that use their author's rights are held");
                None
            }
        }
    } else {
        None
    };
    RightsPolicy { unadmitted, key }
}

/// Runs the controller as the flags say: sharded, elected, or alone.
async fn operate(
    args: &RunArgs,
    client: Client,
    ctx: Arc<Context>,
    ready: &AtomicBool,
    leader: prometheus::IntGauge,
) -> Result<(), OperatorError> {
    if let Some(gate) = ctx.sharding.gate.clone() {
        leader.set(1);
        ready.store(true, Ordering::SeqCst);
        run_sharded(args, client, ctx, gate).await
    } else if args.leader_elect {
        run_elected(args, client, ctx, ready, leader).await
    } else {
        leader.set(1);
        ready.store(true, Ordering::SeqCst);
        run_controller(args, ctx, shutdown_signal()).await;
        Ok(())
    }
}

/// `--tenant-store-endpoints` and `--tenant-store-secret-names`, parsed (a bad pattern or name
/// stops the operator at start).
fn tenant_stores(args: &RunArgs) -> Result<crate::store::tenant::TenantStorePolicy, OperatorError> {
    let policy = crate::store::tenant::TenantStorePolicy::parse(&args.tenant_store_endpoints)
        .and_then(|p| p.with_secret_names(&args.tenant_store_secret_names))
        .map_err(|e| OperatorError::Config(e.to_string()))?;
    if policy.enabled() {
        info!(
            endpoints = ?args.tenant_store_endpoints,
            secret_names = ?policy.secret_names(),
            "tenant stores on"
        );
    }
    Ok(policy)
}

/// The shard gate of `--sharding` (None without).
fn sharding(
    args: &RunArgs,
    metrics: &Metrics,
) -> Result<Option<Arc<crate::shard::gate::ShardGate>>, OperatorError> {
    if args.sharding && args.leader_elect {
        return Err(OperatorError::Config(
            "--sharding and --leader-elect exclude each other (every sharded replica runs the controller)"
                .to_string(),
        ));
    }
    Ok(args
        .sharding
        .then(|| crate::shard::gate::ShardGate::counted(args.shards, metrics.shards_owned.clone())))
}

/// The clean-up of open multipart uploads before attempts, when the store has them. Never a
/// startup error: without it, killed attempts' uploads are left to the lifecycle rule.
fn open_uploads_cleaner(
    store_url: &str,
    options: &[(String, String)],
) -> Option<Arc<crate::store::open_uploads::OpenUploads>> {
    match crate::store::open_uploads::OpenUploads::for_store(store_url, options) {
        Ok(cleaner) => cleaner.map(Arc::new),
        Err(e) => {
            warn!(error = %e, "open multipart uploads will not be cleaned before attempts");
            None
        }
    }
}

/// Registers the open multipart uploads cleaner's metric (when there is a cleaner).
fn register_open_uploads(
    metrics: &Metrics,
    cleaner: Option<&crate::store::open_uploads::OpenUploads>,
) {
    if let Some(cleaner) = cleaner {
        if let Err(e) = metrics.registry.register(Box::new(cleaner.metric())) {
            warn!(error = %e, "registering the open multipart uploads metric");
        }
    }
}

/// The image checker of `--preflight-images`.
fn preflight(args: &RunArgs) -> Result<Option<Arc<crate::registry::ImageResolver>>, OperatorError> {
    if !args.preflight_images {
        return Ok(None);
    }
    let resolver = crate::registry::ImageResolver::new(crate::registry::ImageSettings::default())
        .map_err(|e| OperatorError::Config(format!("--preflight-images: {e}")))?;
    Ok(Some(Arc::new(resolver)))
}

/// The packer's argv from `run --holder-binary` and `--pack-command` (default: `<binary> pack`),
/// or why the flags are refused: both programs must be absolute paths, so nothing a workload can
/// write into a directory on the holder's PATH is ever run in its place (docs/contract.md "The
/// holder runs only the operator's code").
fn holder_programs(
    binary: &str,
    pack_command: Option<&str>,
) -> Result<Vec<String>, HolderProgramError> {
    if !binary.starts_with('/') {
        return Err(HolderProgramError::Binary(binary.to_string()));
    }
    let pack: Vec<String> = match pack_command {
        Some(command) => command.split_whitespace().map(str::to_string).collect(),
        None => vec![binary.to_string(), "pack".to_string()],
    };
    match pack.first() {
        None => Err(HolderProgramError::EmptyPack),
        Some(program) if !program.starts_with('/') => {
            Err(HolderProgramError::Pack(program.clone()))
        }
        Some(_) => Ok(pack),
    }
}

#[cfg(test)]
mod tests {
    use super::holder_programs;

    #[test]
    fn the_holders_programs_are_absolute_paths_and_the_packer_defaults_to_the_holder_binary() {
        let bin = "/usr/local/bin/sandboxrun-operator";
        assert_eq!(holder_programs(bin, None).unwrap(), [bin, "pack"]);
        assert_eq!(
            holder_programs(bin, Some("/opt/pack --fast")).unwrap(),
            ["/opt/pack", "--fast"]
        );
        assert!(holder_programs("sandboxrun-operator", None)
            .unwrap_err()
            .to_string()
            .contains("--holder-binary"));
        assert!(holder_programs(bin, Some("sandboxrun-operator pack"))
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        assert!(holder_programs(bin, Some("  "))
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
