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
pub(crate) fn answer(result: Result<Lease, kube::Error>) -> Result<Written, kube::Error> {
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

#[cfg(test)]
mod tests {
    //! The Lease writes against a mock apiserver (tower-test, no cluster): each write of an
    //! existing Lease is a PUT carrying the resourceVersion read, and 409 is a lost race.

    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{json, Value};

    use super::*;

    type SeenLog = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// A mock apiserver answering every request with `status` and `body`.
    fn apiserver(status: u16, body: Value) -> (Client, SeenLog) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let (parts, payload) = request.into_parts();
                let bytes = payload.collect_bytes().await.unwrap_or_default();
                log.lock().unwrap().push((
                    parts.method.to_string(),
                    parts.uri.to_string(),
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                ));
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "sys"), seen)
    }

    fn held(holder: &str, version: &str) -> Lease {
        serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "op-shard-3", "namespace": "sys", "resourceVersion": version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 2}
        }))
        .unwrap()
    }

    fn leases(client: Client) -> Leases {
        Leases::new(client, "sys", "op", "me", Duration::from_secs(15))
    }

    #[tokio::test]
    async fn a_taken_lease_is_a_guarded_put_and_a_conflict_is_a_lost_race() {
        let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Conflict", "code": 409, "message": "the object has been modified"});
        let (client, seen) = apiserver(409, conflict);
        let answer = leases(client)
            .acquire("op-shard-3", SHARD_KIND, Some(&held("", "41")))
            .await
            .unwrap();
        assert!(matches!(answer, Written::Lost), "{answer:?}");
        let seen = seen.lock().unwrap();
        let (method, uri, body) = &seen[0];
        assert_eq!(method, "PUT");
        assert!(uri.contains("/namespaces/sys/leases/op-shard-3"), "{uri}");
        assert_eq!(
            body["metadata"]["resourceVersion"], "41",
            "guarded by what was read"
        );
        assert_eq!(body["spec"]["holderIdentity"], "me");
        assert_eq!(body["spec"]["leaseTransitions"], 3);
    }

    #[tokio::test]
    async fn a_release_clears_the_holder_and_a_renewal_keeps_it_both_guarded() {
        let (client, seen) = apiserver(200, serde_json::to_value(held("me", "42")).unwrap());
        let l = leases(client);
        assert!(matches!(
            l.renew(&held("me", "41")).await.unwrap(),
            Written::Done
        ));
        assert!(matches!(
            l.release(&held("me", "42")).await.unwrap(),
            Written::Done
        ));
        let seen = seen.lock().unwrap();
        let (renew, release) = (&seen[0].2, &seen[1].2);
        assert_eq!(renew["metadata"]["resourceVersion"], "41");
        assert_eq!(renew["spec"]["holderIdentity"], "me");
        assert!(renew["spec"]["renewTime"].is_string());
        assert_eq!(release["metadata"]["resourceVersion"], "42");
        assert!(release["spec"]["holderIdentity"].is_null(), "{release}");
        assert!(seen.iter().all(|(method, _, _)| method == "PUT"));
    }

    #[tokio::test]
    async fn a_new_lease_is_created_labelled_with_its_group_and_kind() {
        let exists = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "AlreadyExists", "code": 409, "message": "already exists"});
        let (client, seen) = apiserver(409, exists);
        let answer = leases(client)
            .acquire("op-shard-3", SHARD_KIND, None)
            .await
            .unwrap();
        assert!(
            matches!(answer, Written::Lost),
            "another replica created it first"
        );
        let seen = seen.lock().unwrap();
        let (method, _, body) = &seen[0];
        assert_eq!(method, "POST");
        assert_eq!(body["metadata"]["labels"][LEASE_GROUP_LABEL], "op");
        assert_eq!(body["metadata"]["labels"][LEASE_KIND_LABEL], "shard");
        assert_eq!(body["spec"]["holderIdentity"], "me");
        assert_eq!(record_of(&held("x", "1")).holder.as_deref(), Some("x"));
        assert_eq!(kind_of(&held("x", "1")), None);
    }
}
