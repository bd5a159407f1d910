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
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use thiserror::Error;
// The runtime's monotonic clock (the system's, unless a test pauses it to run the deadlines in
// virtual time).
use tokio::time::Instant;
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
        owner.bounded_round().await?;
        // Woken at the next deadline too: a shard goes unrenewed past it only by that much.
        let next = Instant::now() + owner.settings.round;
        let wake = owner.deadline().map_or(next, |d| d.min(next));
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = stop.cancelled() => break,
        }
    }
    owner.release_all().await;
    Ok(())
}

impl Owner {
    /// A round that is cut off at the deadline of the owned shards: the Lease calls have no
    /// timeout of their own, and an apiserver that stops answering (a partition that drops the
    /// packets) would otherwise hold the round, and this check, past the moment another replica
    /// may take the shards. A round cut off owning nothing is only logged (it held nothing);
    /// it is bounded by a Lease's duration.
    async fn bounded_round(&mut self) -> Result<(), ShardError> {
        let deadline = self.deadline();
        let limit = deadline.unwrap_or_else(|| Instant::now() + self.settings.duration);
        match tokio::time::timeout_at(limit, self.round()).await {
            Ok(result) => result,
            Err(_) => {
                warn!("the shard leases' round got no answer from the apiserver in time");
                self.check_deadlines(Instant::now())
            }
        }
    }

    /// The moment the first owned shard counts as lost unless renewed before: the send of its
    /// last renewal that succeeded plus `duration - 2 × round`. None when none is owned.
    fn deadline(&self) -> Option<Instant> {
        let limit = self
            .settings
            .duration
            .saturating_sub(self.settings.round * 2);
        let now = Instant::now();
        self.gate
            .owned()
            .into_keys()
            .map(|shard| self.renewed.get(&shard).copied().unwrap_or(now) + limit)
            .min()
    }

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
            let holder = self
                .sightings
                .see(name, lease::record_of(lease), now.into_std());
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

#[cfg(test)]
mod tests {
    //! Two owner loops against one fake Lease store (a mock apiserver that keeps the Leases and
    //! checks resourceVersions like the real one): a shard is never in both replicas' gates, a
    //! shard given back waits for its work in flight, and the shards end balanced.

    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;
    use kube::Client;
    use serde_json::{json, Value};

    use super::*;

    /// The fake apiserver's Leases: name → (resourceVersion, object).
    type Store = Arc<Mutex<BTreeMap<String, (u64, Value)>>>;

    fn status(code: u16, reason: &str) -> (u16, Value) {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": code, "message": reason});
        (code, body)
    }

    /// Answers one request as the apiserver would (list, create, guarded replace, delete).
    fn answer(store: &Store, method: &str, path: &str, body: Value) -> (u16, Value) {
        let mut leases = store.lock().unwrap();
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        let next_version = leases.values().map(|(v, _)| *v).max().unwrap_or(0) + 1;
        let stamp = |mut lease: Value, version: u64| {
            lease["metadata"]["resourceVersion"] = json!(version.to_string());
            lease
        };
        match method {
            "GET" => {
                let items: Vec<Value> = leases.values().map(|(_, l)| l.clone()).collect();
                (
                    200,
                    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                    "metadata": {}, "items": items}),
                )
            }
            "POST" => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if leases.contains_key(&name) {
                    return status(409, "AlreadyExists");
                }
                let lease = stamp(body, next_version);
                leases.insert(name, (next_version, lease.clone()));
                (201, lease)
            }
            "PUT" => {
                let sent: u64 = body["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                match leases.get(&name) {
                    Some((version, _)) if *version == sent => {
                        let lease = stamp(body, next_version);
                        leases.insert(name, (next_version, lease.clone()));
                        (200, lease)
                    }
                    Some(_) => status(409, "Conflict"),
                    None => status(404, "NotFound"),
                }
            }
            "DELETE" => {
                leases.remove(&name);
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                )
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }

    fn apiserver(store: Store) -> Client {
        apiserver_cut_by(store, Arc::default())
    }

    /// [`apiserver`] until `cut` is set; then every request is held unanswered (a partition
    /// that drops the packets: no error, no answer).
    fn apiserver_cut_by(store: Store, cut: Arc<AtomicBool>) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                if cut.load(Ordering::SeqCst) {
                    held.push(send);
                    continue;
                }
                let (parts, payload) = request.into_parts();
                let bytes = payload.collect_bytes().await.unwrap_or_default();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (code, reply) = answer(&store, parts.method.as_str(), parts.uri.path(), body);
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(reply.to_string().into_bytes()))
                        .unwrap(),
                );
            }
        });
        Client::new(service, "sys")
    }

    fn owner(store: &Store, identity: &str) -> Owner {
        let duration = Duration::from_secs(15);
        Owner {
            leases: Leases::new(
                apiserver(Arc::clone(store)),
                "sys",
                "op",
                identity,
                duration,
            ),
            settings: OwnerSettings {
                group: "op".into(),
                duration,
                round: Duration::from_secs(2),
            },
            gate: ShardGate::new(8),
            cancel: CancellationToken::new(),
            sightings: Sightings::default(),
            renewed: HashMap::new(),
        }
    }

    fn owned(o: &Owner) -> BTreeSet<u32> {
        o.gate.owned().into_keys().collect()
    }

    #[tokio::test]
    async fn two_replicas_never_own_a_shard_at_once_and_a_release_waits_for_its_work() {
        let store: Store = Arc::default();
        let mut a = owner(&store, "a");
        a.round().await.unwrap();
        assert_eq!(owned(&a).len(), 8, "alone, a takes every shard");
        // Work in flight in a's highest shard (the first it gives back).
        let busy = a.gate.enter(7).expect("owned");
        let mut b = owner(&store, "b");
        for i in 0..12 {
            b.round().await.unwrap();
            a.round().await.unwrap();
            let (in_a, in_b) = (owned(&a), owned(&b));
            assert!(in_a.is_disjoint(&in_b), "round {i}: {in_a:?} and {in_b:?}");
            assert!(
                !in_b.contains(&7),
                "round {i}: 7 taken while a still works in it"
            );
        }
        assert_eq!(
            a.gate.owned().get(&7),
            Some(&true),
            "7 is being given back, not yet"
        );
        drop(busy);
        for i in 0..6 {
            a.round().await.unwrap();
            b.round().await.unwrap();
            assert!(owned(&a).is_disjoint(&owned(&b)), "round {i}");
        }
        assert_eq!(
            (owned(&a).len(), owned(&b).len()),
            (4, 4),
            "{:?} {:?}",
            owned(&a),
            owned(&b)
        );
        assert!(owned(&b).contains(&7), "once idle, 7 moved");
        // b stops: it gives its shards back and deletes its heartbeat; a takes them at once.
        b.release_all().await;
        assert!(!store.lock().unwrap().contains_key("op-replica-b"));
        a.round().await.unwrap();
        a.round().await.unwrap();
        assert_eq!(owned(&a).len(), 8, "{:?}", owned(&a));
    }

    /// A replica whose apiserver stops answering (no error, no answer: the Lease calls have no
    /// timeout) stops before its Leases may be taken: its round is cut off at the renewal
    /// deadline, every drain is cancelled and the loop ends with `Lost`, within
    /// `duration - 2 × round` of its last renewal (virtual time).
    #[tokio::test(start_paused = true)]
    async fn a_replica_the_apiserver_stops_answering_stops_before_its_leases_may_be_taken() {
        let store: Store = Arc::default();
        let cut = Arc::new(AtomicBool::new(false));
        let duration = Duration::from_secs(15);
        let round = Duration::from_secs(2);
        let leases = Leases::new(
            apiserver_cut_by(Arc::clone(&store), Arc::clone(&cut)),
            "sys",
            "op",
            "a",
            duration,
        );
        let settings = OwnerSettings {
            group: "op".into(),
            duration,
            round,
        };
        let gate = ShardGate::new(8);
        let cancel = CancellationToken::new();
        let stop = CancellationToken::new();
        let owner = tokio::spawn(run(
            leases,
            settings,
            Arc::clone(&gate),
            cancel.clone(),
            stop.clone(),
        ));
        while gate.owned().len() < 8 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The shards were just acquired (their last renewal): the apiserver goes silent.
        let cut_at = Instant::now();
        cut.store(true, Ordering::SeqCst);
        let ended = tokio::time::timeout(Duration::from_secs(120), owner)
            .await
            .expect("the loop ends by itself, not stuck in a round")
            .expect("the loop does not panic");
        assert!(matches!(ended, Err(ShardError::Lost { .. })), "{ended:?}");
        assert!(cancel.is_cancelled(), "every drain is cancelled");
        let stopped_after = cut_at.elapsed();
        assert!(
            stopped_after <= duration - round * 2,
            "stopped {stopped_after:?} after its last renewal: another replica may take its \
             shards {duration:?} after it"
        );
        assert!(!stop.is_cancelled());
    }
}
