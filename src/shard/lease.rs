//! The Lease reads and writes of sharding (the only I/O of [`super`], docs/contract.md
//! "Shards"). Every write of a Lease that exists carries the resourceVersion this replica read:
//! two replicas that write the same Lease at once are told apart by the apiserver (one write
//! wins, the other gets 409 Conflict and is answered [`Written::Lost`]), so a shard never has
//! two holders.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

use super::sightings::Record;
use super::{LEASE_GROUP_LABEL, LEASE_KIND_LABEL};

/// The kind label of a shard's Lease.
pub(crate) const SHARD_KIND: &str = "shard";
/// The kind label of a replica's heartbeat Lease.
pub(crate) const REPLICA_KIND: &str = "replica";

/// The answer of a guarded write.
#[derive(Debug)]
pub(crate) enum Written {
    /// Written.
    Done,
    /// Another replica wrote it first (409 Conflict, or it already exists): nothing changed.
    Lost,
}

/// This replica's Leases in the operator's namespace.
#[derive(Clone)]
pub(crate) struct Leases {
    api: Api<Lease>,
    group: String,
    identity: String,
    duration: Duration,
}

impl Leases {
    /// The Leases of `group` in `namespace`, written as `identity`, each held for `duration`.
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        group: &str,
        identity: &str,
        duration: Duration,
    ) -> Leases {
        Leases {
            api: Api::namespaced(client, namespace),
            group: group.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    /// This replica's identity.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// Every Lease of the group (shards and heartbeats).
    pub(crate) async fn list(&self) -> Result<Vec<Lease>, kube::Error> {
        let selector = format!("{LEASE_GROUP_LABEL}={}", self.group);
        Ok(self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    /// Takes the Lease `name` (kind `kind`): creates it held by this replica when `current` is
    /// None, else writes this replica as its holder over `current` (guarded). The caller has
    /// decided that `current` is free (released or expired).
    pub(crate) async fn acquire(
        &self,
        name: &str,
        kind: &str,
        current: Option<&Lease>,
    ) -> Result<Written, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(current) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(self.labels(kind)),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(Some(now.clone()), now, 0)),
            };
            return answer(self.api.create(&PostParams::default(), &lease).await);
        };
        let mut next = current.clone();
        let transitions = current
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
            .saturating_add(1);
        next.spec = Some(self.spec(Some(now.clone()), now, transitions));
        self.replace(next).await
    }

    /// Renews `current`, which this replica holds (guarded).
    pub(crate) async fn renew(&self, current: &Lease) -> Result<Written, kube::Error> {
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.identity.clone());
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(self.duration_seconds());
        self.replace(next).await
    }

    /// Clears the holder of `current`, which this replica holds (guarded): another replica may
    /// take it at once.
    pub(crate) async fn release(&self, current: &Lease) -> Result<Written, kube::Error> {
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.replace(next).await
    }

    /// Deletes this replica's heartbeat Lease (it stops: the others count one replica less at once).
    pub(crate) async fn delete(&self, name: &str) -> Result<(), kube::Error> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn replace(&self, lease: Lease) -> Result<Written, kube::Error> {
        let name = lease.name_any();
        answer(
            self.api
                .replace(&name, &PostParams::default(), &lease)
                .await,
        )
    }

    fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LEASE_GROUP_LABEL.to_string(), self.group.clone()),
            (LEASE_KIND_LABEL.to_string(), kind.to_string()),
        ])
    }

    fn spec(&self, acquired: Option<MicroTime>, now: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            acquire_time: acquired,
            renew_time: Some(now),
            lease_duration_seconds: Some(self.duration_seconds()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// A write's answer: 409 (Conflict, AlreadyExists) is a lost race, not an error.
fn answer(result: Result<Lease, kube::Error>) -> Result<Written, kube::Error> {
    match result {
        Ok(_) => Ok(Written::Done),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Written::Lost),
        Err(e) => Err(e),
    }
}

/// The kind label of a Lease (`shard`, `replica`).
pub(crate) fn kind_of(lease: &Lease) -> Option<&str> {
    lease.labels().get(LEASE_KIND_LABEL).map(String::as_str)
}

/// What [`super::sightings`] compares of a Lease.
pub(crate) fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.as_ref();
    Record {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        renewed: spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string()),
        duration: Duration::from_secs(
            spec.and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(15),
        ),
    }
}
