//! One teardown of a run at a time across replicas (docs/contract.md "Shards", issue #38): a
//! sharded replica takes the run's drain claim — a Lease `<group>-drain-<uid>` in the operator's
//! namespace, which tenants cannot write — before its teardown uploads anything, and gives it
//! back when the teardown ends. The shard label decides which replica reconciles a run, and a
//! tenant can rewrite its runs' labels when the webhook is out of the way: a run relabelled to
//! another replica's shard mid-drain was drained by both, the second rewriting the archive the
//! first had committed. With the claim the second waits; it takes the claim over only when the
//! holder's heartbeat Lease has expired (the holder is gone), judged by [`Sightings`] on this
//! replica's own clock. A holder whose claim was taken over stops its drains before it commits
//! ([`DrainHold`]'s watch and its fence).
//!
//! Pure: [`decide`]. I/O: [`DrainClaims::claim`], [`DrainHold`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::lease::{record_of, Written};
use super::sightings::Sightings;
use super::{replica_lease_name, LEASE_KIND_LABEL};

/// The kind label of a drain claim.
pub(crate) const DRAIN_KIND: &str = "drain";
/// The label naming the group of a drain claim. Not the shard Leases' group label: the owner
/// loop lists those every round and has no use for one claim per teardown in flight.
pub const DRAIN_GROUP_LABEL: &str = "sandbox.iterion.io/drain-group";
/// How often a holder re-reads its claim while it drains.
const WATCH_EVERY: Duration = Duration::from_secs(3);

/// The name of the drain claim of the run with `uid`: `<group>-drain-<uid>`.
pub fn drain_claim_name(group: &str, uid: &str) -> String {
    format!("{group}-drain-{uid}")
}

/// What to do about a run's drain claim.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// None exists: create it.
    Create,
    /// This replica holds it already (its earlier teardown of the run, cut short).
    Mine,
    /// Held by a replica that is gone (heartbeat expired or released) or by nobody: take it over.
    TakeOver,
    /// Held by a live replica: wait.
    Busy(String),
}

/// What to do, from the claim's holder (None: no claim), this replica's identity and whether
/// the holder is alive (its heartbeat Lease held and not expired, as [`Sightings`] judge it).
pub(crate) fn decide(claim: Option<Option<&str>>, me: &str, holder_alive: bool) -> Decision {
    match claim {
        None => Decision::Create,
        Some(Some(holder)) if holder == me => Decision::Mine,
        Some(Some(holder)) if holder_alive => Decision::Busy(holder.to_string()),
        Some(_) => Decision::TakeOver,
    }
}

/// The answer of [`DrainClaims::claim`].
pub(crate) enum Claim {
    /// This replica holds the claim until the hold is released.
    Held(DrainHold),
    /// Another live replica drains the run.
    Busy(String),
}

/// This replica's drain claims (`run --sharding`).
pub(crate) struct DrainClaims {
    api: Api<Lease>,
    group: String,
    identity: String,
    duration: Duration,
    sightings: Mutex<Sightings>,
}

impl DrainClaims {
    /// The claims of `group` in `namespace`, written as `identity`; heartbeats expire after
    /// `duration` unchanged (the shard Leases' duration).
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        group: &str,
        identity: &str,
        duration: Duration,
    ) -> DrainClaims {
        DrainClaims {
            api: Api::namespaced(client, namespace),
            group: group.to_string(),
            identity: identity.to_string(),
            duration,
            sightings: Mutex::new(Sightings::default()),
        }
    }

    /// Takes the drain claim of the run with `uid` for this replica, or names its live holder.
    /// A race with another replica's write is lost as Busy (the apiserver's 409).
    pub(crate) async fn claim(
        self: &Arc<Self>,
        uid: &str,
        parent: &CancellationToken,
    ) -> Result<Claim, kube::Error> {
        let name = drain_claim_name(&self.group, uid);
        let current = get_lease(&self.api, &name).await?;
        let holder = current.as_ref().map(|l| holder_of(l).map(str::to_string));
        let alive = match holder.as_ref().and_then(Option::as_deref) {
            Some(h) if h != self.identity => self.heartbeat_alive(h).await?,
            _ => false,
        };
        let decision = decide(holder.as_ref().map(|h| h.as_deref()), &self.identity, alive);
        let written = match (&decision, current) {
            (Decision::Busy(holder), _) => return Ok(Claim::Busy(holder.clone())),
            (Decision::Mine, _) => true,
            (Decision::Create, _) => self.create(&name).await?,
            (Decision::TakeOver, Some(current)) => {
                let taken = self.take_over(current).await?;
                if taken {
                    info!(claim = %name, "took over the drain claim of a replica that is gone");
                }
                taken
            }
            (Decision::TakeOver, None) => self.create(&name).await?,
        };
        if !written {
            return Ok(Claim::Busy(
                "another replica (it wrote the claim first)".into(),
            ));
        }
        Ok(Claim::Held(DrainHold::start(
            Arc::clone(self),
            name,
            parent,
        )))
    }

    /// Whether `holder`'s heartbeat Lease is held and was renewed within its duration, as seen
    /// from this replica's clock (a heartbeat seen for the first time counts as alive).
    async fn heartbeat_alive(&self, holder: &str) -> Result<bool, kube::Error> {
        let name = replica_lease_name(&self.group, holder);
        let Some(heartbeat) = get_lease(&self.api, &name).await? else {
            return Ok(false);
        };
        let mut sightings = self
            .sightings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(sightings
            .see(&name, record_of(&heartbeat), Instant::now())
            .is_some())
    }

    async fn create(&self, name: &str) -> Result<bool, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([
                    (DRAIN_GROUP_LABEL.to_string(), self.group.clone()),
                    (LEASE_KIND_LABEL.to_string(), DRAIN_KIND.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(self.spec()),
        };
        done_unless_lost(self.api.create(&PostParams::default(), &lease).await)
    }

    /// Writes this replica as the holder over `current` (guarded by its resourceVersion).
    async fn take_over(&self, mut current: Lease) -> Result<bool, kube::Error> {
        let transitions = current
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
            .saturating_add(1);
        current.spec = Some(LeaseSpec {
            lease_transitions: Some(transitions),
            ..self.spec()
        });
        let name = current.name_any();
        done_unless_lost(
            self.api
                .replace(&name, &PostParams::default(), &current)
                .await,
        )
    }

    fn spec(&self) -> LeaseSpec {
        let now = MicroTime(jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: i32::try_from(self.duration.as_secs()).ok(),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }
    }

    /// Whether this replica still holds the claim `name` (a read error: it cannot tell, so no).
    async fn holds(&self, name: &str) -> bool {
        match get_lease(&self.api, name).await {
            Ok(Some(lease)) => holder_of(&lease) == Some(self.identity.as_str()),
            Ok(None) => false,
            Err(e) => {
                warn!(claim = name, error = %e, "cannot read the drain claim");
                false
            }
        }
    }

    /// Deletes the claim `name` if this replica still holds it (guarded by its resourceVersion).
    async fn release(&self, name: &str) {
        let lease = match get_lease(&self.api, name).await {
            Ok(Some(lease)) if holder_of(&lease) == Some(self.identity.as_str()) => lease,
            Ok(_) => return,
            Err(e) => {
                warn!(claim = name, error = %e, "cannot read the drain claim to give it back");
                return;
            }
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.resource_version(),
                uid: lease.uid(),
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = self.api.delete(name, &params).await {
            warn!(claim = name, error = %e, "could not give the drain claim back; the next teardown takes it over once this replica is gone");
        }
    }
}

/// The Lease `name`, read by a list selecting its name: the chart's sharding Role grants list,
/// create, update and delete on Leases, not get (docs/operations.md "Scaling").
async fn get_lease(api: &Api<Lease>, name: &str) -> Result<Option<Lease>, kube::Error> {
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    Ok(api.list(&params).await?.items.into_iter().next())
}

/// The holder a claim names (None: released).
fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether a write was done: 409 (Conflict, AlreadyExists) is a race another replica won
/// ([`super::lease::answer`]).
fn done_unless_lost(result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    Ok(matches!(super::lease::answer(result)?, Written::Done))
}

/// A drain claim this replica holds: `lost` is cancelled when the claim is seen taken (the
/// drains then stop and record nothing, as on a lost shard), and [`DrainHold::fence`] is
/// asked once more right before each manifest commit. Released by [`DrainHold::release`].
pub(crate) struct DrainHold {
    claims: Arc<DrainClaims>,
    name: String,
    lost: CancellationToken,
    watch: tokio::task::JoinHandle<()>,
}

impl DrainHold {
    fn start(claims: Arc<DrainClaims>, name: String, parent: &CancellationToken) -> DrainHold {
        let lost = parent.child_token();
        let watch = tokio::spawn(watch(Arc::clone(&claims), name.clone(), lost.clone()));
        DrainHold {
            claims,
            name,
            lost,
            watch,
        }
    }

    /// Cancelled when the claim is lost (or the parent token is).
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// The check before a commit: whether this replica still holds the claim.
    pub(crate) fn fence(&self) -> crate::drain::Fence {
        let claims = Arc::clone(&self.claims);
        let name = self.name.clone();
        let lost = self.lost.clone();
        crate::drain::Fence::new(move || -> BoxFuture<'static, bool> {
            let claims = Arc::clone(&claims);
            let name = name.clone();
            let lost = lost.clone();
            Box::pin(async move { !lost.is_cancelled() && claims.holds(&name).await })
        })
    }

    /// Gives the claim back (when this replica still holds it).
    pub(crate) async fn release(self) {
        self.watch.abort();
        if !self.lost.is_cancelled() {
            self.claims.release(&self.name).await;
        }
    }
}

impl Drop for DrainHold {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Re-reads the claim every [`WATCH_EVERY`]; cancels `lost` once another replica holds it or it
/// is gone.
async fn watch(claims: Arc<DrainClaims>, name: String, lost: CancellationToken) {
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        if let Ok(found) = get_lease(&claims.api, &name).await {
            let held = found
                .as_ref()
                .and_then(holder_of)
                .is_some_and(|h| h == claims.identity);
            if !held {
                warn!(claim = %name, "the drain claim was taken over; stopping this replica's drains of the run");
                lost.cancel();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_held_by_a_live_replica_is_waited_for_and_a_dead_ones_taken_over() {
        assert_eq!(decide(None, "a", false), Decision::Create);
        assert_eq!(decide(Some(Some("a")), "a", false), Decision::Mine);
        assert_eq!(
            decide(Some(Some("b")), "a", true),
            Decision::Busy("b".into())
        );
        assert_eq!(decide(Some(Some("b")), "a", false), Decision::TakeOver);
        assert_eq!(decide(Some(None), "a", false), Decision::TakeOver);
    }

    #[test]
    fn claim_names_are_per_run_and_group() {
        assert_eq!(drain_claim_name("sbr", "1234-abcd"), "sbr-drain-1234-abcd");
    }
}
