//! `run --leader-elect`: the controller only while this replica holds the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kube::Client;
use tracing::{info, warn};

use super::error::OperatorError;
use super::lifecycle::run_controller;
use crate::cmd::run::RunArgs;
use crate::controller::Context;
use crate::process::shutdown_signal;

/// With `--leader-elect`: Ready at once, the controller only while this replica holds the
/// lease; a lost lease stops the drains in flight at once and ends the process with an error
/// (so a fresh start, or the other replica, takes over cleanly).
pub(super) async fn run_elected(
    args: &RunArgs,
    client: Client,
    ctx: Arc<Context>,
    ready: &AtomicBool,
    leader: prometheus::IntGauge,
) -> Result<(), OperatorError> {
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, &args.lease_name)
        .with_namespace(&args.pod_namespace)
        .with_identity(&args.pod_name)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .map_err(|e| OperatorError::Leader(e.to_string()))?;
    let (mut leading, _task) = manager.watch().await;
    // Ready before leading: a standby replica is healthy and must not be restarted for waiting.
    ready.store(true, Ordering::SeqCst);
    info!(lease = %args.lease_name, identity = %args.pod_name, "waiting for the lease");
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown_signal()));
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                changed.map_err(|e| OperatorError::Leader(e.to_string()))?;
            }
            _ = shutdown.clone() => return Ok(()),
        }
    }
    info!(identity = %args.pod_name, "leading: starting the controller");
    leader.set(1);
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = lost_rx => {}
        }
    };
    // Fired on a lost lease: in-flight drains stop at once (their uploads abort themselves)
    // instead of finishing under a replica that no longer leads. On SIGTERM they get
    // SHUTDOWN_DRAIN_GRACE to finish first (settle_drains).
    let cancel = ctx.in_flight.cancel.clone();
    let watcher = tokio::spawn(async move {
        loop {
            if leading.changed().await.is_err() || !*leading.borrow_and_update() {
                warn!("leadership lost; stopping in-flight drains");
                leader.set(0);
                cancel.cancel();
                let _ = lost_tx.send(());
                return;
            }
        }
    });
    run_controller(args, ctx, stop).await;
    if watcher.is_finished() {
        warn!("leadership lost; exiting so another replica takes over");
        return Err(OperatorError::Leader("leadership lost".to_string()));
    }
    watcher.abort();
    Ok(())
}
