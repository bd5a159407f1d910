//! `run --sharding`: the replica's share of the shards (the owner loop) and the controller on the
//! runs of the shards it owns; the runs' drain claims (docs/contract.md "Shards").

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tracing::{info, warn};

use super::error::OperatorError;
use super::lifecycle::{run_controller, ABORT_GRACE};
use crate::cmd::run::RunArgs;
use crate::controller::Context;
use crate::process::shutdown_signal;

/// The runs' drain claims of a sharded replica: in its namespace, its Lease group, as itself
/// (src/shard/drain_claim.rs).
pub(super) fn drain_claims(
    args: &RunArgs,
    client: &Client,
) -> Arc<crate::shard::drain_claim::DrainClaims> {
    Arc::new(crate::shard::drain_claim::DrainClaims::new(
        client.clone(),
        &args.pod_namespace,
        &args.lease_name,
        &args.pod_name,
        SHARD_LEASE_DURATION,
    ))
}

/// How long a shard's Lease lasts unrenewed: a killed replica's shards are taken this long
/// (plus a round) after its last renewal.
pub(super) const SHARD_LEASE_DURATION: Duration = Duration::from_secs(15);

/// How often a sharded replica renews its Leases and rebalances.
pub(super) const SHARD_ROUND: Duration = Duration::from_secs(2);

/// With `--sharding`: the owner loop takes this replica's fair share of the shards and the
/// controller runs at once on the runs of the shards owned (docs/contract.md "Shards"). A lost
/// shard stops every drain in flight and ends the process with an error; on SIGTERM the drains
/// settle first, then every shard is given back and the heartbeat deleted.
pub(super) async fn run_sharded(
    args: &RunArgs,
    client: Client,
    ctx: Arc<Context>,
    gate: Arc<crate::shard::gate::ShardGate>,
) -> Result<(), OperatorError> {
    use crate::shard::{lease::Leases, owner};
    let leases = Leases::new(
        client,
        &args.pod_namespace,
        &args.lease_name,
        &args.pod_name,
        SHARD_LEASE_DURATION,
    );
    let settings = owner::OwnerSettings {
        group: args.lease_name.clone(),
        duration: SHARD_LEASE_DURATION,
        round: SHARD_ROUND,
    };
    info!(identity = %args.pod_name, shards = gate.shards(), "sharding: taking a fair share of the shards");
    let stop_owner = tokio_util::sync::CancellationToken::new();
    let mut owner = tokio::spawn(owner::run(
        leases,
        settings,
        gate,
        ctx.in_flight.cancel.clone(),
        stop_owner.clone(),
    ));
    // A lost shard cancels ctx.in_flight.cancel: the controller stops too.
    let lost = ctx.in_flight.cancel.clone();
    let stop = async move {
        tokio::select! {
            () = shutdown_signal() => {}
            () = lost.cancelled() => {}
        }
    };
    let controller = run_controller(args, ctx, stop);
    tokio::pin!(controller);
    tokio::select! {
        () = &mut controller => {}
        // The owner loop ends by itself only when a shard is lost (it cancelled every drain):
        // the process exits before another replica may take the shard, without waiting for
        // reconciles stuck on an apiserver that does not answer (docs/contract.md "Shards").
        ended = &mut owner => {
            if tokio::time::timeout(FENCE_GRACE, &mut controller).await.is_err() {
                warn!("a shard was lost and the controller did not stop in time; exiting");
            }
            return match ended {
                Ok(result) => result.map_err(OperatorError::from),
                Err(e) => Err(OperatorError::Config(format!("the shard owner loop failed: {e}"))),
            };
        }
    }
    stop_owner.cancel();
    match tokio::time::timeout(ABORT_GRACE, owner).await {
        Ok(Ok(result)) => result.map_err(OperatorError::from),
        Ok(Err(e)) => Err(OperatorError::Config(format!(
            "the shard owner loop failed: {e}"
        ))),
        Err(_) => {
            warn!("the shards were not given back in time; their leases expire");
            Ok(())
        }
    }
}

/// How long a replica that lost a shard waits for its controller to stop before it exits: within
/// the two rounds between its renewal deadline and the moment another replica may take the shard
/// (docs/contract.md "Shards"). Its drains were cancelled when the shard was lost.
pub(super) const FENCE_GRACE: Duration = Duration::from_secs(1);
