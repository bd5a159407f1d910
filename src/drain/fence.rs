//! The last check before a path's manifest is committed (issue #38, docs/contract.md "Shards"):
//! whether this replica may still commit — with sharding, whether it still holds the run's drain
//! claim (src/shard/drain_claim.rs). A drain whose fence says no records nothing and leaves the
//! path to the replica that holds the claim; its archive is not deleted (the key may already hold
//! the other replica's archive).

use std::sync::Arc;

use futures::future::BoxFuture;

/// An asynchronous yes/no: may this drain commit now?
#[derive(Clone)]
pub struct Fence(Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>);

impl Fence {
    /// A fence asking `check`.
    pub fn new(check: impl Fn() -> BoxFuture<'static, bool> + Send + Sync + 'static) -> Fence {
        Fence(Arc::new(check))
    }

    /// Whether the drain may commit now.
    pub async fn holds(&self) -> bool {
        (self.0)().await
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}
