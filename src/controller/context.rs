//! What the controller needs besides the cluster: the store, the settings of every stage, the
//! Event recorder, the metrics and the pool of drains in flight.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use super::drains::pool::{DrainPool, FairSlots};
use super::run::decide::DecideSettings;
use super::run::observe::StoreView;
use crate::api::{Retention, SandboxRun, SandboxRunStatus};
use crate::caps::CapSettings;
use crate::drain::bandwidth::DrainBandwidth;
use crate::drain::wire::Wire;
use crate::metrics::Metrics;
use crate::pod::PodSettings;
use crate::registry::ImageResolver;
use crate::shard::drain_claim::DrainClaims;
use crate::shard::gate::{ShardGate, ShardGuard};
use crate::store::open_uploads::OpenUploads;
use crate::store::tenant::{TenantStoreError, TenantStorePolicy};
use crate::store::tenant_read::{self, RunStore};

pub(crate) use crate::names::MANAGER;

/// Path slots one run may hold at once unless told (`run --max-path-drains-per-run`).
pub(crate) const DEFAULT_PATH_DRAINS_PER_RUN: usize = 4;

/// What the controller needs besides the cluster, in the few things it carries: the stores, the
/// settings of each stage (pod, admission, caps, decide, drain, lifecycle), the drains in
/// flight, what this replica remembers between reconciles, its shards, and its voice (Events,
/// metrics).
pub(crate) struct Context {
    /// The cluster.
    pub client: Client,
    /// Where drained archives go.
    pub stores: Stores,
    /// Pod builder settings.
    pub pod: PodSettings,
    /// The egress proxy's pods as this replica watches them (their addresses are denied to a
    /// run while its egress gate waits).
    pub egress_proxy: crate::egress::proxy_pods::ProxyPods,
    /// What the operator judges again on its own before a pod is built.
    pub admission: Admission,
    /// Read-back caps.
    pub caps: CapSettings,
    /// Settings of the pure decision (image-pull timeout).
    pub decide: DecideSettings,
    /// How paths are drained.
    pub drain: DrainSettings,
    /// The run lifecycle's switches and windows.
    pub lifecycle: Lifecycle,
    /// The drains in flight and the slots they share.
    pub in_flight: InFlight,
    /// What this replica remembers of runs between reconciles (lost on restart by design).
    pub memory: Memory,
    /// The shards this replica owns and the runs' drain claims (`run --sharding`).
    pub sharding: Sharding,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
}

/// Where drained archives go: the operator's store, and tenants' own.
pub(crate) struct Stores {
    /// The operator's store (`--store-url`).
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store.
    pub prefix: object_store::path::Path,
    /// The store URL (for object URLs in status).
    pub url: String,
    /// Aborts an S3 archive key's open multipart uploads before each attempt (None: not S3).
    pub open_uploads: Option<Arc<OpenUploads>>,
    /// The endpoints tenant stores may send their credentials to (`run
    /// --tenant-store-endpoints`; empty: tenant stores off). docs/contract.md "A store per
    /// namespace".
    pub tenants: TenantStorePolicy,
}

/// What the operator judges again before it builds a pod, webhook or not.
pub(crate) struct Admission {
    /// The admission rules, judged again before a pod is built ([`Context::with_rules`]).
    pub rules: crate::policy::RuleSettings,
    /// The admission stamps a run that uses its author's rights needs before it gets a pod
    /// ([`Context::with_rights`]).
    pub rights: crate::policy::stamp::RightsPolicy,
    /// Resolves a run's image before its pod is created (`run --preflight-images`; None: off).
    pub preflight: Option<Arc<ImageResolver>>,
}

/// How a path is drained.
pub(crate) struct DrainSettings {
    /// argv of the packer in the holder (the path is appended).
    pub pack_command: Vec<String>,
    /// How the packer is asked to send its tar (`run --drain-wire`).
    pub wire: Wire,
    /// Per-path idle bound of a drain (`run --drain-idle-timeout`, src/drain/idle.rs).
    pub idle: Duration,
    /// Bytes a second all this replica's drains may read together from the packers' exec
    /// streams (`run --max-drain-bytes-per-second`, src/drain/bandwidth.rs; default unlimited).
    pub bandwidth: DrainBandwidth,
}

/// The run lifecycle's switches and windows.
pub(crate) struct Lifecycle {
    /// How long a run's passing states may last unreported (`run --quiet-window`,
    /// docs/contract.md "A quiet lifecycle").
    pub settle: Duration,
    /// Whether runs labelled `kueue.x-k8s.io/queue-name` wait for Kueue (`run --kueue`,
    /// docs/user-guide.md "Queueing with Kueue").
    pub kueue: bool,
    /// Whether runs made from a pooled template take a warm pool's ready pod (`run
    /// --warm-pools`).
    pub warm_pools: bool,
    /// What deleting a run does to its stored files when its spec does not say
    /// (`run --default-retention`).
    pub default_retention: Retention,
    /// Checkpoints one run may take (`run --max-checkpoints`).
    pub max_checkpoints: u32,
}

/// The drains in flight, off the reconcile workers, and the slots they share.
pub(crate) struct InFlight {
    /// Cancelled when this replica must stop draining at once (lost lease, shutdown): in-flight
    /// drains record nothing and the next leader resumes them.
    pub cancel: CancellationToken,
    /// The teardowns and checkpoints in flight.
    pub drains: DrainPool,
    /// Paths being drained at once, across every run (`run --max-concurrent-path-drains`): the
    /// paths of one run drain in parallel, at most `run --max-path-drains-per-run` of them, and
    /// this bounds the operator's drain memory. Handed out fairly (docs/contract.md "Fair drain
    /// slots").
    pub path_slots: FairSlots,
}

/// What this replica remembers of runs between reconciles; lost on restart by design.
#[derive(Default)]
pub(crate) struct Memory {
    /// When this process last tried to create each refused run's pod (by run uid): the back-off
    /// of [`super::run::refusals::create_retry_wait`] (after a restart the next attempt is
    /// immediate, and its pause already as long as the refusals have lasted).
    create_attempts: Mutex<HashMap<String, Timestamp>>,
    /// The last status this replica wrote of each run: (its digest, the resourceVersion the run
    /// had when it was written, the one the write made). See [`Context::written_status`].
    written: Mutex<HashMap<String, WrittenStatus>>,
    /// The uids of the runs whose pod this replica created and has not reported yet
    /// ([`super::run::plan::SETTLE`]): what the status would have said, kept in memory meanwhile.
    unreported_pods: Mutex<HashSet<String>>,
    /// The resourceVersion each new run's finalizer patch made, until a reconcile sees the run
    /// past it ([`Context::behind_own_write`]).
    finalized: Mutex<HashMap<String, String>>,
    /// The pool pods this replica's runs are claiming right now (a burst's runs pick past each
    /// other's: [`crate::pool::reservations`]).
    pub claims: crate::pool::reservations::ClaimReservations,
    /// The pools and their pods as the pools' controller's watches have them: what a claim
    /// reads its pool and the pool's pods from ([`crate::pool::watched`]).
    pub watched_pools: crate::pool::watched::WatchedPools,
    /// The attaches held open to ready pool pods' launchers, for a claim to write its start on
    /// ([`crate::pool::attaches`]).
    pub held_attaches: Arc<crate::pool::attaches::HeldAttaches>,
    /// When each pending pod's Events were last read, and the reads in flight
    /// ([`super::run::observe::EventReads`]).
    pub events: super::run::observe::EventReads,
}

/// The shards this replica owns (`run --sharding`; both None: every run is this replica's).
#[derive(Default)]
pub(crate) struct Sharding {
    /// The gate of the shards owned.
    pub gate: Option<Arc<ShardGate>>,
    /// The runs' drain claims, one teardown of a run at a time across replicas whatever its
    /// shard label says (src/shard/drain_claim.rs).
    pub drain_claims: Option<Arc<DrainClaims>>,
}

impl Context {
    /// The same context with `retention` as the operator-wide default of
    /// `spec.readBack.retention`.
    pub(crate) fn with_default_retention(mut self, retention: Retention) -> Context {
        self.lifecycle.default_retention = retention;
        self
    }

    /// The same context with at most `max` paths drained at once, across every run, at least 1
    /// (`run --max-concurrent-path-drains`), at most `per_run` of them one run's
    /// (`run --max-path-drains-per-run`).
    pub(crate) fn with_path_slots(mut self, (max, per_run): (usize, usize)) -> Context {
        self.in_flight.path_slots = FairSlots::new(max, per_run, None);
        self
    }

    /// The same context watching the egress proxy's pods (`run --egress-proxy-*`).
    pub(crate) fn with_egress_proxy(
        mut self,
        proxy: crate::egress::proxy_pods::ProxyPods,
    ) -> Context {
        self.egress_proxy = proxy;
        self
    }

    /// The same context with `settle` as its quiet window (`run --quiet-window`).
    pub(crate) fn with_quiet_window(mut self, settle: Duration) -> Context {
        self.lifecycle.settle = settle;
        self
    }

    /// The same context with runs in Kueue queues waiting for Kueue (`run --kueue`).
    pub(crate) fn with_kueue(mut self, kueue: bool) -> Context {
        self.lifecycle.kueue = kueue;
        self
    }

    /// The same context with runs from pooled templates taking warm pods (`run --warm-pools`).
    pub(crate) fn with_warm_pools(mut self, on: bool) -> Context {
        self.lifecycle.warm_pools = on;
        self
    }

    /// The same context cutting off a packer idle for `idle` (`run --drain-idle-timeout`).
    pub(crate) fn with_drain_idle(mut self, idle: Duration) -> Context {
        self.drain.idle = idle;
        self
    }

    /// The same context pacing its drains to `bandwidth` together
    /// (`run --max-drain-bytes-per-second`).
    pub(crate) fn with_drain_bandwidth(mut self, bandwidth: DrainBandwidth) -> Context {
        self.drain.bandwidth = bandwidth;
        self
    }

    /// The same context asking packers for `wire` (`run --drain-wire`).
    pub(crate) fn with_drain_wire(mut self, wire: Wire) -> Context {
        self.drain.wire = wire;
        self
    }

    /// The same context with the clean-up of open multipart uploads before each attempt.
    pub(crate) fn with_open_uploads(mut self, open_uploads: Option<Arc<OpenUploads>>) -> Context {
        self.stores.open_uploads = open_uploads;
        self
    }

    /// The client, and the key a warm run's pod's seal verifies under ([`crate::pool::seal`]):
    /// what finding a run's pod needs.
    pub(crate) fn seal_check(&self) -> (&kube::Client, Option<&crate::policy::stamp::StampKey>) {
        (&self.client, self.admission.rights.key.as_ref())
    }

    /// The same context resolving each run's image before its pod is created
    /// (`run --preflight-images`).
    /// The same context judging runs by `rules` before it builds their pods (the rules the
    /// webhook applies; docs/contract.md "The operator never builds a pod its own rules refuse").
    pub(crate) fn with_rules(mut self, rules: crate::policy::RuleSettings) -> Context {
        self.admission.rules = rules;
        self
    }

    /// The same context requiring admission stamps as `rights` says (docs/contract.md "A run
    /// uses only its author's rights").
    pub(crate) fn with_rights(mut self, rights: crate::policy::stamp::RightsPolicy) -> Context {
        self.admission.rights = rights;
        self
    }

    pub(crate) fn with_preflight(mut self, resolver: Option<Arc<ImageResolver>>) -> Context {
        self.admission.preflight = resolver;
        self
    }

    /// The same context working only on the runs of the shards `gate` owns (`run --sharding`).
    pub(crate) fn with_shards(mut self, gate: Option<Arc<ShardGate>>) -> Context {
        self.sharding.gate = gate;
        self
    }

    /// The same context allowing `max` checkpoints a run (`run --max-checkpoints`).
    pub(crate) fn with_max_checkpoints(mut self, max: u32) -> Context {
        self.lifecycle.max_checkpoints = max;
        self
    }

    /// The same context taking each run's drain claim before its teardown (`run --sharding`).
    pub(crate) fn with_drain_claims(mut self, claims: Option<Arc<DrainClaims>>) -> Context {
        self.sharding.drain_claims = claims;
        self
    }

    /// What may work on `run` now: `Some(None)` without sharding, `Some(guard)` when this
    /// replica owns the run's shard, None when another replica's (docs/contract.md "Shards").
    pub(crate) fn enter_shard(&self, run: &SandboxRun) -> Option<Option<ShardGuard>> {
        self.enter_shard_of(&run.metadata)
    }

    /// [`Context::enter_shard`] for any object of `meta` (a run, a SandboxRunPool): its shard
    /// label when canonical, else its uid's shard.
    pub(crate) fn enter_shard_of(
        &self,
        meta: &kube::api::ObjectMeta,
    ) -> Option<Option<ShardGuard>> {
        let Some(gate) = &self.sharding.gate else {
            return Some(None);
        };
        gate.enter(gate.shard_of_meta(meta)?).map(Some)
    }

    /// A guard for the teardown a guarded reconcile of `run` starts (None without sharding).
    pub(crate) fn join_shard(&self, run: &SandboxRun) -> Option<ShardGuard> {
        let gate = self.sharding.gate.as_ref()?;
        gate.join(gate.shard_of(run)?)
    }

    /// A context with an Event recorder reporting as `instance`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Client,
        store: Arc<dyn ObjectStore>,
        store_prefix: object_store::path::Path,
        store_url: String,
        pod: PodSettings,
        caps: CapSettings,
        decide: DecideSettings,
        pack_command: Vec<String>,
        metrics: Metrics,
        instance: String,
        max_concurrent_drains: usize,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.to_string(),
                instance: Some(instance),
            },
        );
        let drains = DrainPool::new(max_concurrent_drains, Some(metrics.drain_queue.clone()));
        Context {
            client,
            stores: Stores {
                store,
                prefix: store_prefix,
                url: store_url,
                open_uploads: None,
                tenants: TenantStorePolicy::default(),
            },
            pod,
            egress_proxy: Default::default(),
            admission: Admission {
                rules: crate::policy::RuleSettings::default(),
                rights: Default::default(),
                preflight: None,
            },
            caps,
            decide,
            drain: DrainSettings {
                pack_command,
                wire: Wire::default(),
                idle: crate::drain::idle::DEFAULT_IDLE_TIMEOUT,
                bandwidth: DrainBandwidth::default(),
            },
            lifecycle: Lifecycle {
                settle: super::run::plan::SETTLE,
                kueue: false,
                warm_pools: false,
                default_retention: Retention::default(),
                max_checkpoints: crate::api::DEFAULT_MAX_CHECKPOINTS,
            },
            in_flight: InFlight {
                cancel: CancellationToken::new(),
                drains,
                path_slots: FairSlots::new(
                    max_concurrent_drains,
                    DEFAULT_PATH_DRAINS_PER_RUN,
                    None,
                ),
            },
            memory: Memory::default(),
            sharding: Sharding::default(),
            recorder,
            metrics,
        }
    }

    /// The same context with tenant stores allowed at `endpoints` (`run --tenant-store-endpoints`).
    pub(crate) fn with_tenant_stores(mut self, endpoints: TenantStorePolicy) -> Context {
        self.stores.tenants = endpoints;
        self
    }

    /// The store `run` uses (docs/contract.md "A store per namespace"): its `storeRef`, else its
    /// namespace's default store ConfigMap, else the operator's. Read now, for this use only:
    /// a tenant's credentials are never kept beyond the returned store.
    /// `namespace`: the run's, from its identity (`crate::identity::RunId`).
    pub(crate) async fn run_store(
        &self,
        (namespace, run): (&str, &SandboxRun),
    ) -> Result<RunStore, TenantStoreError> {
        tenant_read::resolve(
            &self.client,
            namespace,
            run.spec.store_ref(),
            &self.stores.tenants,
            || self.operator_store(),
        )
        .await
    }

    /// The operator's own store (`--store-url`).
    pub(crate) fn operator_store(&self) -> RunStore {
        RunStore {
            store: Arc::clone(&self.stores.store),
            prefix: self.stores.prefix.clone(),
            url: self.stores.url.clone(),
            tenant: None,
        }
    }

    /// Where the drained archives of a run that uses `store` are, as the observe stage reads it.
    pub(crate) fn store_view(store: &RunStore) -> StoreView<'_> {
        StoreView {
            store: &store.store,
            prefix: &store.prefix,
            url: &store.url,
        }
    }

    /// The run's drain timeout in seconds (`spec.readBack.drainTimeout`, else the operator's
    /// default): the bound of its drain and of the retries of deleting its stored files.
    pub(crate) fn drain_timeout_seconds(&self, run: &SandboxRun) -> i64 {
        crate::pod::drain_timeout_seconds(run, &self.pod)
            .unwrap_or(self.pod.default_drain_timeout_seconds)
    }

    /// When this process last tried to create the run's pod and was refused.
    pub(crate) fn last_create_attempt(&self, run: &SandboxRun) -> Option<Timestamp> {
        let uid = run.metadata.uid.as_deref()?;
        self.memory.create_attempts.lock().ok()?.get(uid).copied()
    }

    /// Remembers a refused attempt to create the run's pod.
    pub(crate) fn record_create_attempt(&self, run: &SandboxRun, at: Timestamp) {
        if let (Some(uid), Ok(mut map)) =
            (run.metadata.uid.clone(), self.memory.create_attempts.lock())
        {
            map.insert(uid, at);
        }
    }

    /// Forgets the run's refused attempts and its unreported pod (its pod was created, or the
    /// run is going).
    pub(crate) fn forget_create_attempt(&self, run: &SandboxRun) {
        let Some(uid) = run.metadata.uid.as_deref() else {
            return;
        };
        if let Ok(mut map) = self.memory.create_attempts.lock() {
            map.remove(uid);
        }
        if let Ok(mut set) = self.memory.unreported_pods.lock() {
            set.remove(uid);
        }
    }

    /// Whether `status` is what this replica last wrote of `run` while the cached `run` is still
    /// the object it wrote over or the one its write made (so nothing else changed it since),
    /// and the digest to remember once it is written.
    pub(crate) fn written_status(&self, run: &SandboxRun, status: &SandboxRunStatus) -> Written {
        let digest = status_digest(status);
        let already = run.metadata.uid.as_deref().is_some_and(|uid| {
            self.memory.written.lock().is_ok_and(|map| {
                already_written(
                    map.get(uid),
                    digest,
                    run.metadata.resource_version.as_deref(),
                )
            })
        });
        Written { digest, already }
    }

    /// Remembers the status just written of `run` (`made`: the resourceVersion the write made).
    pub(crate) fn remember_written_status(
        &self,
        run: &SandboxRun,
        digest: u64,
        made: Option<String>,
    ) {
        if let (Some(uid), Ok(mut map)) = (run.metadata.uid.clone(), self.memory.written.lock()) {
            map.insert(
                uid,
                WrittenStatus {
                    digest,
                    over: run.metadata.resource_version.clone(),
                    made,
                },
            );
        }
    }

    /// The resourceVersion this replica's last status write of `run` made (None: none is
    /// remembered): what a drain answers the pool as it ends ([`super::drains::pool::wakes_at_end`]).
    pub(crate) fn written_version(&self, run: &SandboxRun) -> Option<String> {
        let uid = run.metadata.uid.as_deref()?;
        let map = self.memory.written.lock().ok()?;
        map.get(uid)?.made.clone()
    }

    /// Remembers the resourceVersion `stored` has: what the finalizer's patch made of a new run.
    pub(crate) fn remember_finalized(&self, stored: &SandboxRun) {
        let (Some(uid), Some(made)) = (
            stored.metadata.uid.clone(),
            stored.metadata.resource_version.clone(),
        ) else {
            return;
        };
        if let Ok(mut map) = self.memory.finalized.lock() {
            map.insert(uid, made);
        }
    }

    /// Whether the cached `run` is the copy a new run's finalizer patch made and this replica's
    /// last status write went over: the finalizer's own event, arriving after the first step the
    /// same reconcile followed it with (docs/contract.md "A new run's finalizer and first step
    /// in one reconcile"). A reconcile of it would decide on what that step's writes changed
    /// already (count a pool's miss again); the status write's own event reconciles the run.
    /// Any other copy forgets the finalizer's version: only that echo is left alone, so a
    /// reconcile a pod's event wakes before the watch delivered a later write still runs.
    pub(crate) fn behind_own_write(&self, run: &SandboxRun) -> bool {
        let (Some(uid), Some(cached)) = (
            run.metadata.uid.as_deref(),
            run.metadata.resource_version.as_deref(),
        ) else {
            return false;
        };
        let Ok(mut finalized) = self.memory.finalized.lock() else {
            return false;
        };
        match finalized.get(uid) {
            Some(made) if made == cached => {}
            Some(_) => {
                finalized.remove(uid);
                return false;
            }
            None => return false,
        }
        self.memory.written.lock().is_ok_and(|map| {
            map.get(uid).is_some_and(|w| {
                w.over.as_deref() == Some(cached) && w.made.as_deref() != Some(cached)
            })
        })
    }

    /// Forgets what was written of the run (it is going).
    pub(crate) fn forget_written_status(&self, run: &SandboxRun) {
        if let (Some(uid), Ok(mut map)) = (run.metadata.uid.as_deref(), self.memory.written.lock())
        {
            map.remove(uid);
        }
        if let (Some(uid), Ok(mut map)) =
            (run.metadata.uid.as_deref(), self.memory.finalized.lock())
        {
            map.remove(uid);
        }
    }

    /// Remembers that this replica created the run's pod and has not reported it yet.
    pub(crate) fn remember_unreported_pod(&self, run: &SandboxRun) {
        if let (Some(uid), Ok(mut set)) =
            (run.metadata.uid.clone(), self.memory.unreported_pods.lock())
        {
            set.insert(uid);
        }
    }

    /// The run as the decision must see it: when this replica created its pod and has not
    /// reported it yet, with that pod's name in its status (in memory only), so a pod that
    /// vanished before it was reported makes the run lost, not given a second pod
    /// (docs/contract.md "A quiet lifecycle"). A run that has a phase was reported: it is forgotten.
    pub(crate) fn with_unreported_pod(&self, run: Arc<SandboxRun>) -> Arc<SandboxRun> {
        match self.memory.unreported_pods.lock() {
            Ok(mut remembered) => super::run::decide::with_unreported_pod(run, &mut remembered),
            Err(_) => run,
        }
    }
}

/// The last status this replica wrote of a run.
#[derive(Clone, Debug)]
pub(crate) struct WrittenStatus {
    digest: u64,
    over: Option<String>,
    made: Option<String>,
}

/// What [`Context::written_status`] found.
pub(crate) struct Written {
    /// The digest of the status to write.
    pub digest: u64,
    /// This replica wrote exactly it and nothing changed the run since.
    pub already: bool,
}

/// A digest of a status (of its JSON: the exact bytes a write would send).
fn status_digest(status: &SandboxRunStatus) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(status)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Whether a status with `digest` is `last` written, on a run whose cached resourceVersion is
/// `cached`: the same digest, and the cache shows the object the write went over or the one it
/// made (anything newer means someone else wrote since: write again).
fn already_written(last: Option<&WrittenStatus>, digest: u64, cached: Option<&str>) -> bool {
    last.is_some_and(|w| {
        w.digest == digest
            && cached
                .is_some_and(|rv| Some(rv) == w.over.as_deref() || Some(rv) == w.made.as_deref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_just_written_is_not_written_again_until_someone_else_changed_the_run() {
        let status = SandboxRunStatus {
            message: Some("workload running".into()),
            ..Default::default()
        };
        let digest = status_digest(&status);
        let last = WrittenStatus {
            digest,
            over: Some("10".into()),
            made: Some("11".into()),
        };
        // The watch has not delivered our write yet (10), or has (11): nothing to write.
        assert!(already_written(Some(&last), digest, Some("10")));
        assert!(already_written(Some(&last), digest, Some("11")));
        // Someone wrote since (12), or another status is wanted, or nothing was written: write.
        assert!(!already_written(Some(&last), digest, Some("12")));
        let other = SandboxRunStatus {
            message: Some("waiting for the pod to run".into()),
            ..Default::default()
        };
        assert!(!already_written(
            Some(&last),
            status_digest(&other),
            Some("11")
        ));
        assert!(!already_written(None, digest, Some("11")));
        assert!(!already_written(Some(&last), digest, None));
    }

    #[tokio::test]
    async fn only_the_finalizers_echo_behind_this_replicas_write_is_left_alone() {
        use crate::controller::testkit::mock_apiserver::{apiserver, context};
        let (client, _) = apiserver(Vec::new());
        let ctx = context(client, Arc::new(object_store::memory::InMemory::new()));
        let at = |rv: &str| {
            let mut run = crate::controller::testkit::fixtures::run_with(&[("/out", false)]);
            run.metadata.resource_version = Some(rv.into());
            run
        };
        assert!(!ctx.behind_own_write(&at("10")), "nothing written");
        // A status written over a copy no finalizer patch made: that copy still reconciles.
        ctx.remember_written_status(&at("9"), 1, Some("10".into()));
        assert!(!ctx.behind_own_write(&at("9")), "not the finalizer's echo");
        // The finalizer's patch made 10; the first step's status went over it.
        ctx.remember_finalized(&at("10"));
        ctx.remember_written_status(&at("10"), 1, Some("11".into()));
        let mut another = at("10");
        another.metadata.uid = Some("another".into());
        assert!(!ctx.behind_own_write(&another), "another run's");
        assert!(ctx.behind_own_write(&at("10")), "the finalizer's echo");
        assert!(
            ctx.behind_own_write(&at("10")),
            "until a newer copy is seen"
        );
        assert!(!ctx.behind_own_write(&at("11")), "the copy the write made");
        assert!(
            !ctx.behind_own_write(&at("10")),
            "once past it, never again"
        );
        // Without a status over the finalizer's copy (a cold pod, reported later), its echo is
        // the run as it is: reconciled.
        let mut fresh = at("20");
        fresh.metadata.uid = Some("fresh".into());
        ctx.remember_finalized(&fresh);
        assert!(!ctx.behind_own_write(&fresh));
        ctx.forget_written_status(&at("11"));
        assert!(!ctx.behind_own_write(&at("10")), "forgotten");
    }
}
