//! The controller's run and its end, whichever way the operator runs: the drains in flight
//! settle, then the aborts of the uploads they left.

use std::sync::Arc;

use tracing::warn;

use crate::cmd::run::RunArgs;
use crate::controller::{self, Context};

/// Runs the controller until `stop`, then lets its drains and their uploads settle.
pub(super) async fn run_controller(
    args: &RunArgs,
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let drains = Arc::clone(&ctx);
    let stop = futures::future::FutureExt::shared(Box::pin(stop));
    if args.warm_pools {
        // Sharded replicas each serve the pools of the shards they hold.
        let pools = controller::pools::run(Arc::clone(&ctx), args.namespaces.clone(), stop.clone());
        tokio::spawn(pools);
    }
    controller::run(ctx, args.namespaces.clone(), args.concurrency, stop).await;
    settle_drains(&drains).await;
    settle_uploads().await;
}

/// How long an exiting operator waits for the aborts of the multipart uploads its cancelled
/// drains left open (docs/contract.md: no orphaned uploads).
pub(super) const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long drains in flight at SIGTERM may go on before they are cancelled: inside the chart's
/// terminationGracePeriodSeconds (60) with room for the aborts that follow.
pub(super) const SHUTDOWN_DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(40);

/// Lets the drains in flight finish (at most [`SHUTDOWN_DRAIN_GRACE`]; at once when the lease was
/// lost, which cancelled them), then cancels the rest and waits for them to stop (a cancelled
/// drain records nothing: the next leader resumes it).
pub(super) async fn settle_drains(ctx: &Context) {
    if ctx.in_flight.drains.wait(SHUTDOWN_DRAIN_GRACE).await {
        return;
    }
    ctx.in_flight.cancel.cancel();
    if !ctx.in_flight.drains.wait(ABORT_GRACE).await {
        warn!(
            left = ctx.in_flight.drains.len(),
            "exiting with drains still stopping; the next leader resumes them"
        );
    }
}

/// Waits for the aborts of cancelled uploads before the process exits (Drop cannot await them).
pub(super) async fn settle_uploads() {
    let left = crate::store::upload_guard::wait_for_pending_aborts(ABORT_GRACE).await;
    if left > 0 {
        warn!(
            left,
            "exiting with multipart upload aborts still running; the bucket's lifecycle rule removes what they leave"
        );
    }
}
