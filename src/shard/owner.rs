//! The owner loop (docs/contract.md "Shards"): every round it lists the group's Leases, renews
//! this replica's heartbeat and shards, gives back the shards being released once nothing works
//! in them, and takes or starts releasing shards as [`assign::decide`] says. It is the only
//! caller of [`lease`]; what it decides comes from [`assign`] and [`sightings`] (pure).
//!
//! A shard whose Lease this replica could not renew for `duration - 2 × round` (by its own
//! clock, from the send of the last renewal that succeeded), or that another replica holds, is
//! lost: the loop ends with [`ShardError::Lost`] and the process stops its drains at once and
//! exits (as a leader that lost its Lease does), before any other replica may take the shard.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::assign::{self, View};
use super::gate::ShardGate;
use super::lease::{self, Leases, Written, REPLICA_KIND, SHARD_KIND};
use super::sightings::Sightings;
use super::{replica_lease_name, shard_lease_name, shard_of_lease_name};

/// Why sharding stopped.
#[derive(Debug, Error)]
pub(crate) enum ShardError {
    /// A shard's Lease was lost (not renewed in time, or held by another replica).
    #[error("shard {shard}'s lease lost: {why}")]
    Lost {
        /// The shard.
        shard: u32,
        /// Why.
        why: &'static str,
    },
}

/// The settings of the loop.
#[derive(Debug, Clone)]
pub(crate) struct OwnerSettings {
    /// The Leases' group (`run --lease-name`).
    pub group: String,
    /// How long a Lease lasts unrenewed.
    pub duration: Duration,
    /// How often the loop runs.
    pub round: Duration,
}

/// The loop's memory between rounds.
struct Owner {
    leases: Leases,
    settings: OwnerSettings,
    gate: Arc<ShardGate>,
    cancel: CancellationToken,
    sightings: Sightings,
    /// When the last renewal (or the acquisition) of each owned shard that succeeded was sent.
    renewed: HashMap<u32, Instant>,
}

/// Runs the loop until `stop` is cancelled, then gives back every shard (the caller has let the
/// drains end first) and deletes the heartbeat. `cancel` is the controller's.
pub(crate) async fn run(
    leases: Leases,
    settings: OwnerSettings,
    gate: Arc<ShardGate>,
    cancel: CancellationToken,
    stop: CancellationToken,
) -> Result<(), ShardError> {
    let mut owner = Owner {
        leases,
        settings,
        gate,
        cancel,
        sightings: Sightings::default(),
        renewed: HashMap::new(),
    };
    loop {
        owner.round().await?;
        tokio::select! {
            () = tokio::time::sleep(owner.settings.round) => {}
            () = stop.cancelled() => break,
        }
    }
    owner.release_all().await;
    Ok(())
}

impl Owner {
    /// One round: observe, keep, decide, write.
    async fn round(&mut self) -> Result<(), ShardError> {
        let now = Instant::now();
        let listed = match self.leases.list().await {
            Ok(listed) => listed,
            Err(e) => {
                warn!(error = %e, "listing the shard leases failed");
                return self.check_deadlines(now);
            }
        };
        let by_name: BTreeMap<String, Lease> =
            listed.into_iter().map(|l| (l.name_any(), l)).collect();
        self.sightings.keep_only(by_name.keys().map(String::as_str));
        self.heartbeat(&by_name).await;
        self.keep_owned(&by_name).await?;
        self.check_deadlines(now)?;
        let (live, holders) = self.observe(&by_name, now);
        let decision = assign::decide(
            &View {
                shards: self.gate.shards(),
                live: &live,
                holders: &holders,
            },
            self.leases.identity(),
        );
        for shard in decision.release {
            if self.gate.owned().get(&shard) == Some(&false) {
                info!(
                    shard,
                    "releasing the shard (rebalancing): waiting for its work in flight"
                );
                self.gate.start_release(shard);
            }
        }
        self.acquire(&decision.acquire, &by_name).await;
        Ok(())
    }

    /// The live replicas (heartbeats not expired, this one included) and each held shard's
    /// holder (this replica's owned shards from its gate; other holders' from their Leases).
    fn observe(
        &mut self,
        by_name: &BTreeMap<String, Lease>,
        now: Instant,
    ) -> (BTreeSet<String>, BTreeMap<u32, String>) {
        let me = self.leases.identity().to_string();
        let mut live = BTreeSet::from([me.clone()]);
        let mut holders = BTreeMap::new();
        for (name, lease) in by_name {
            let holder = self.sightings.see(name, lease::record_of(lease), now);
            match (lease::kind_of(lease), holder) {
                (Some(REPLICA_KIND), Some(holder)) => {
                    live.insert(holder);
                }
                (Some(SHARD_KIND), Some(holder)) if holder != me => {
                    if let Some(shard) = shard_of_lease_name(&self.settings.group, name) {
                        holders.insert(shard, holder);
                    }
                }
                _ => {}
            }
        }
        for shard in self.gate.owned().into_keys() {
            holders.insert(shard, me.clone());
        }
        (live, holders)
    }

    /// Creates or renews this replica's heartbeat Lease.
    async fn heartbeat(&mut self, by_name: &BTreeMap<String, Lease>) {
        let name = replica_lease_name(&self.settings.group, self.leases.identity());
        let written = match by_name.get(&name) {
            Some(current) => self.leases.renew(current).await,
            None => self.leases.acquire(&name, REPLICA_KIND, None).await,
        };
        if let Err(e) = written {
            warn!(error = %e, "renewing this replica's heartbeat lease failed");
        }
    }

    /// Renews the owned shards, and gives back those being released once idle: every write at
    /// once, so a round takes one write's time however many shards this replica holds.
    async fn keep_owned(&mut self, by_name: &BTreeMap<String, Lease>) -> Result<(), ShardError> {
        let mut writes = Vec::new();
        for (shard, releasing) in self.gate.owned() {
            let name = shard_lease_name(&self.settings.group, shard);
            let Some(current) = by_name.get(&name) else {
                return self.lose(shard, "its lease was deleted");
            };
            let holder = current
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder != Some(self.leases.identity()) {
                return self.lose(shard, "another replica holds its lease");
            }
            let release = releasing && self.gate.is_idle(shard);
            let leases = &self.leases;
            writes.push(async move {
                let sent = Instant::now();
                let written = if release {
                    leases.release(current).await
                } else {
                    leases.renew(current).await
                };
                (shard, release, sent, written)
            });
        }
        for (shard, release, sent, written) in futures::future::join_all(writes).await {
            match (written, release) {
                (Ok(Written::Done), true) => {
                    info!(shard, "released the shard");
                    self.gate.forget(shard);
                    self.renewed.remove(&shard);
                }
                (Ok(Written::Done), false) => {
                    self.renewed.insert(shard, sent);
                }
                (Ok(Written::Lost), _) => debug!(shard, "the lease's write raced; next round"),
                (Err(e), _) => warn!(shard, error = %e, "writing the shard's lease failed"),
            }
        }
        Ok(())
    }

    /// Takes the free shards `shards` (as decided), every write at once.
    async fn acquire(&mut self, shards: &[u32], by_name: &BTreeMap<String, Lease>) {
        let leases = &self.leases;
        let group = &self.settings.group;
        let writes = shards.iter().map(|&shard| async move {
            let name = shard_lease_name(group, shard);
            let sent = Instant::now();
            let written = leases.acquire(&name, SHARD_KIND, by_name.get(&name)).await;
            (shard, sent, written)
        });
        for (shard, sent, written) in futures::future::join_all(writes).await {
            match written {
                Ok(Written::Done) => {
                    info!(shard, "acquired the shard");
                    self.renewed.insert(shard, sent);
                    self.gate.own(shard, &self.cancel);
                }
                Ok(Written::Lost) => debug!(shard, "another replica took the shard first"),
                Err(e) => warn!(shard, error = %e, "acquiring the shard's lease failed"),
            }
        }
    }

    /// Fails when an owned shard went unrenewed too long: before any other replica may count
    /// its Lease expired.
    fn check_deadlines(&self, now: Instant) -> Result<(), ShardError> {
        let limit = self
            .settings
            .duration
            .saturating_sub(self.settings.round * 2);
        for shard in self.gate.owned().into_keys() {
            let last = self.renewed.get(&shard).copied().unwrap_or(now);
            if now.saturating_duration_since(last) >= limit {
                return self.lose(shard, "not renewed in time");
            }
        }
        Ok(())
    }

    fn lose(&self, shard: u32, why: &'static str) -> Result<(), ShardError> {
        warn!(shard, why, "shard lost; stopping every drain in flight");
        self.cancel.cancel();
        Err(ShardError::Lost { shard, why })
    }

    /// Gives back every owned shard and deletes the heartbeat (on shutdown, after the drains
    /// ended): the survivors take the shards at once instead of after the Leases expire.
    async fn release_all(&mut self) {
        if let Ok(listed) = self.leases.list().await {
            for shard in self.gate.owned().into_keys() {
                self.gate.start_release(shard);
                let name = shard_lease_name(&self.settings.group, shard);
                let mine = |l: &&Lease| {
                    l.name_any() == name
                        && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                            == Some(self.leases.identity())
                };
                let Some(current) = listed.iter().find(mine) else {
                    continue;
                };
                if !self.gate.is_idle(shard) {
                    warn!(
                        shard,
                        "work still in flight at shutdown; its lease is left to expire"
                    );
                    continue;
                }
                if let Err(e) = self.leases.release(current).await {
                    warn!(shard, error = %e, "releasing the shard's lease failed");
                }
                self.gate.forget(shard);
            }
        }
        let heartbeat = replica_lease_name(&self.settings.group, self.leases.identity());
        if let Err(e) = self.leases.delete(&heartbeat).await {
            warn!(error = %e, "deleting this replica's heartbeat lease failed");
        }
    }
}
