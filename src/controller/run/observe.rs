//! Observe: read the world a reconcile decides on — the run's pod (and, for a pod stuck
//! Pending, its Warning Events), the live run, and the manifests a drain already committed — and
//! turn the pod into the facts the decision needs (`crate::controller::pod_view::PodView`, whose
//! interpretation is pure and lives there). The readers here only read.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use object_store::ObjectStore;
use tracing::warn;

use crate::api::{ReadBackStatus, SandboxRun};
use crate::controller::error::{kube_err, ControllerError};
use crate::controller::pod_view::{
    pod_events_due, should_read_pod_events, stuck_from_events, undrained_paths, PodEventFact,
    PodProblem, PodView, POD_EVENTS_LIMIT,
};
use crate::identity::{self, RunId};
use crate::pod::WORKLOAD_CONTAINER;
use crate::policy::pull_secrets::pull_credentials;
use crate::policy::stamp::StampKey;
use crate::pool::watched::WatchedPools;
use crate::registry::{ImageResolver, Resolution};

/// What a reconcile found: the run's own pod (if any) and the facts read from it.
#[derive(Clone, Debug)]
pub(crate) struct Observation {
    /// The run's identity, made once here: a run without one is observed no further.
    pub id: RunId,
    /// The name the run's pod has (or will have).
    pub pod_name: String,
    /// The run's pod, when it exists and the run owns it.
    pub pod: Option<Pod>,
    /// The facts of that pod (with the cause its Events give, when they were read).
    pub view: Option<PodView>,
}

/// What reading the world found.
#[derive(Clone, Debug)]
pub(crate) enum Observed {
    /// The run and its pod (or the absence of one).
    Run(Observation),
    /// A pod with the run's pod name exists and the run does not own it: it is not ours to drain
    /// or delete.
    NameTaken {
        /// What was found, without the pod.
        observation: Observation,
        /// The pod that holds the name.
        other: Box<Pod>,
    },
}

/// Reads the run's pod and, when it has been Pending a while with nothing in its status, the
/// Warning Events that may say why (FailedMount), bounded.
/// The run's Kueue Workload (docs/user-guide.md "Queueing with Kueue"), as JSON; None when
/// there is none.
pub(crate) async fn workload(
    client: &Client,
    id: &RunId,
) -> Result<Option<serde_json::Value>, ControllerError> {
    let name = crate::kueue::workload_name(&id.name);
    let ar = crate::kueue::workload_resource();
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &id.namespace, &ar);
    let found = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get Workload {name}")))?;
    Ok(found.and_then(|w| serde_json::to_value(w).ok()))
}

/// The ResourceFlavor `name` (Kueue admitted a run's Workload to it), as JSON; a flavor that is
/// gone is an empty one.
pub(crate) async fn resource_flavor(
    client: &Client,
    name: &str,
) -> Result<serde_json::Value, ControllerError> {
    let api: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &crate::kueue::flavor_resource());
    let found = api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get ResourceFlavor {name}")))?;
    Ok(found
        .and_then(|f| serde_json::to_value(f).ok())
        .unwrap_or_default())
}

/// The WorkloadPriorityClass `name` a queued run names: its value; None when there is none
/// (the Workload then has no priority, as Kueue's own jobs without a class).
pub(crate) async fn workload_priority(
    client: &Client,
    name: &str,
) -> Result<Option<crate::kueue::Priority>, ControllerError> {
    let ar = crate::kueue::priority_class_resource();
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &ar);
    let found = api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get WorkloadPriorityClass {name}")))?;
    Ok(found.and_then(|c| {
        Some(crate::kueue::Priority {
            name: name.to_string(),
            value: c.data["value"].as_i64()?,
        })
    }))
}

pub(crate) async fn observe(
    (client, key): (&Client, Option<&StampKey>),
    events: &EventReads,
    run: &SandboxRun,
    now: Timestamp,
) -> Result<Observed, ControllerError> {
    let id = RunId::of(run)?;
    let (pod_name, found) = get_pod(client, (&id, run)).await?;
    let mut observation = Observation {
        id,
        pod_name,
        pod: None,
        view: None,
    };
    let pod = match found {
        Some(p) if is_runs(key, &p, run) => p,
        Some(other) => {
            return Ok(Observed::NameTaken {
                observation,
                other: Box::new(other),
            })
        }
        None => return Ok(Observed::Run(observation)),
    };
    let mut view = PodView::of(&pod);
    view.problem = match events.take(&pod, &view, now) {
        Some(EventsRead::Now(uid, _slot)) => {
            let found = stuck_problem_from_events(client, &observation.id.namespace, &pod).await;
            events.found(uid, found.clone());
            found
        }
        Some(EventsRead::Kept(found)) => found,
        None => view.problem,
    };
    observation.pod = Some(pod);
    observation.view = Some(view);
    Ok(Observed::Run(observation))
}

/// This replica's reads of pending pods' Events: when each pod's were last read and what that
/// read found, and how many reads may be in flight at once. A read lists its namespace's Events
/// with a field selector (nothing indexes them by pod: the apiserver reads every Event of the
/// namespace from etcd), so a namespace full of Events — a tenant's own — makes each read slow:
/// at most [`EVENT_READS_AT_ONCE`] reconciles wait on one, and a pod's are read again only after
/// the pause between two looks ([`pod_events_due`]). Meanwhile a reconcile goes on with what the
/// last read found (a stuck pod stays stuck, told once).
pub(crate) struct EventReads {
    last: std::sync::Mutex<std::collections::HashMap<String, LastRead>>,
    slots: tokio::sync::Semaphore,
}

/// When a pod's Events were last read, and the problem they named.
struct LastRead {
    at: Timestamp,
    found: Option<PodProblem>,
}

/// Whether a reconcile reads its pod's Events now (the pod's uid and the slot held while it
/// does), or goes on with what the last read found.
enum EventsRead<'a> {
    Now(String, tokio::sync::SemaphorePermit<'a>),
    Kept(Option<PodProblem>),
}

/// Reads of pods' Events in flight at once, at most.
pub(crate) const EVENT_READS_AT_ONCE: usize = 2;
/// Past this many pods remembered, those last read before [`RECHECK_FORGET`] are forgotten.
const REMEMBERED_EVENT_READS: usize = 4096;
const RECHECK_FORGET: std::time::Duration = std::time::Duration::from_secs(600);

impl Default for EventReads {
    fn default() -> Self {
        EventReads {
            last: std::sync::Mutex::default(),
            slots: tokio::sync::Semaphore::new(EVENT_READS_AT_ONCE),
        }
    }
}

impl EventReads {
    /// For a pod whose Events are worth reading ([`should_read_pod_events`]; None otherwise): a
    /// slot to read them now, when they are due and a slot is free (the read counts as done at
    /// `now`), else what the last read found.
    fn take(&self, pod: &Pod, view: &PodView, now: Timestamp) -> Option<EventsRead<'_>> {
        if !should_read_pod_events(view, now) {
            return None;
        }
        let uid = pod.metadata.uid.as_deref()?;
        let mut last = self.last.lock().ok()?;
        let seen = last.get(uid);
        let kept = seen.and_then(|r| r.found.clone());
        if !pod_events_due(view, now, seen.map(|r| r.at)) {
            return Some(EventsRead::Kept(kept));
        }
        let Ok(slot) = self.slots.try_acquire() else {
            return Some(EventsRead::Kept(kept));
        };
        if last.len() >= REMEMBERED_EVENT_READS {
            let horizon = now.checked_sub(RECHECK_FORGET).unwrap_or(now);
            last.retain(|_, r| r.at > horizon);
        }
        last.insert(
            uid.to_string(),
            LastRead {
                at: now,
                found: kept,
            },
        );
        Some(EventsRead::Now(uid.to_string(), slot))
    }

    /// Records what the read of the pod `uid`'s Events found.
    fn found(&self, uid: String, found: Option<PodProblem>) {
        if let Ok(mut last) = self.last.lock() {
            if let Some(read) = last.get_mut(&uid) {
                read.found = found;
            }
        }
    }
}

/// Whether `pod`, of the name of the run's current pod, is the run's: owned by it, and, for an
/// attempt a warm pool served, sealed by that pool ([`crate::pool::seal::runs_pod`]).
fn is_runs(key: Option<&StampKey>, pod: &Pod, run: &SandboxRun) -> bool {
    identity::owned_by(pod, run) && crate::pool::seal::runs_pod(key, run, pod)
}

/// The run's pod as the apiserver has it now, without its managedFields; None when it is gone
/// or is not the run's (`key`: the operator's, which a warm run's pod's seal verifies under).
pub(crate) async fn own_pod(
    (client, key): (&Client, Option<&StampKey>),
    run: &SandboxRun,
) -> Result<Option<Pod>, ControllerError> {
    let (_, found) = get_pod(client, (&RunId::of(run)?, run)).await?;
    Ok(found.filter(|p| is_runs(key, p, run)).map(|mut p| {
        p.metadata.managed_fields = None;
        p
    }))
}

/// The pod named after the run, whoever owns it, as the apiserver has it now: (the pod's name,
/// the pod).
async fn get_pod(
    client: &Client,
    (id, run): (&RunId, &SandboxRun),
) -> Result<(String, Option<Pod>), ControllerError> {
    let namespace = &id.namespace;
    let pod_name = identity::current_pod_name(run);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let found = pods
        .get_opt(&pod_name)
        .await
        .map_err(kube_err(format!("get pod {namespace}/{pod_name}")))?;
    Ok((pod_name, found))
}

/// The warm pool of `reference` in `ns` and its pods (claimed ones too), when there is one (a
/// run's claim, `super::warm`): the pool and its pods as the pools' watches have them when
/// `cache` is given and has them ([`WatchedPools::pool_for`], [`WatchedPools::of_pool`]), else
/// listed live.
pub(crate) async fn pool_of(
    (client, cache): (&Client, Option<&WatchedPools>),
    ns: &str,
    reference: &crate::api::TemplateRef,
) -> Result<Option<(crate::api::SandboxRunPool, Vec<Pod>)>, ControllerError> {
    let watched = cache.and_then(|c| c.pool_for(ns, reference));
    let pool = match watched {
        Some(pool) => pool,
        None => match listed_pool(client, ns, reference).await? {
            Some(pool) => pool,
            None => return Ok(None),
        },
    };
    let name = pool.name_any();
    let value = crate::pool::pod::label_value(&name);
    let watched = cache.and_then(|c| c.of_pool(ns, &value));
    if let Some(pods) = watched {
        return Ok(Some((pool, pods)));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("{}={value}", crate::pool::pod::POOL_LABEL);
    let pods = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_err(format!("list the pods of pool {ns}/{name}")))?
        .items;
    Ok(Some((pool, pods)))
}

/// The pool of `ns` that serves `reference`, listed live; None when there is none.
async fn listed_pool(
    client: &Client,
    ns: &str,
    reference: &crate::api::TemplateRef,
) -> Result<Option<crate::api::SandboxRunPool>, ControllerError> {
    let pools: Api<crate::api::SandboxRunPool> = Api::namespaced(client.clone(), ns);
    let listed = match pools.list(&ListParams::default()).await {
        Ok(listed) => listed,
        // The SandboxRunPool CRD is not installed (an upgrade that applied only the older CRDs,
        // issue #53): no pool can exist, the run starts cold. A reconcile that failed here held
        // every templated run for ever.
        Err(kube::Error::Api(e)) if e.code == 404 => {
            warn!(namespace = %ns, "the SandboxRunPool CRD is not installed (apply every CRD of crds/): templated runs start cold");
            return Ok(None);
        }
        Err(e) => {
            return Err(kube_err(format!("list the SandboxRunPools of {ns}"))(e));
        }
    };
    Ok(listed
        .items
        .into_iter()
        .find(|p| &p.spec.template_ref == reference))
}

/// The run as the apiserver has it now (None: it is gone). The watch cache can lag behind this
/// operator's own last status write.
pub(crate) async fn live_run(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<SandboxRun>, ControllerError> {
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), namespace);
    runs.get_opt(name)
        .await
        .map_err(kube_err(format!("get {namespace}/{name}")))
}

/// The run as the apiserver has it now, as made from the template record its pod was built from
/// (a template gives a run its paths): what a drain job in the pool works on once it has its
/// slot. None when it is gone, or is another run of the same name (a different uid).
pub(crate) async fn live_made_run(
    client: &Client,
    run: &SandboxRun,
) -> Result<Option<SandboxRun>, ControllerError> {
    let id = RunId::of(run)?;
    let Some(live) = live_run(client, &id.namespace, &id.name).await? else {
        return Ok(None);
    };
    if live.uid().as_deref() != Some(id.uid.as_str()) {
        return Ok(None);
    }
    Ok(Some(crate::template::recorded(&live).unwrap_or(live)))
}

/// The template `reference` names for a run of `namespace` (a SandboxRunTemplate there, or a
/// ClusterSandboxRunTemplate; None: it does not exist). A read the operator is forbidden is a
/// verdict (Err inside: the run is held saying so); any other error is retried.
pub(crate) async fn template(
    client: &Client,
    namespace: &str,
    reference: &crate::api::TemplateRef,
) -> Result<
    Result<Option<crate::template::Fetched>, crate::template::TemplateUnusable>,
    ControllerError,
> {
    use crate::api::{ClusterSandboxRunTemplate, SandboxRunTemplate, TemplateKind};
    let name = reference.name.as_str();
    let read = match reference.kind {
        TemplateKind::SandboxRunTemplate => {
            let api: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), namespace);
            api.get_opt(name).await.map(|t| t.map(Into::into))
        }
        TemplateKind::ClusterSandboxRunTemplate => {
            let api: Api<ClusterSandboxRunTemplate> = Api::all(client.clone());
            api.get_opt(name).await.map(|t| t.map(Into::into))
        }
    };
    let what = reference.describe(namespace);
    match read {
        Ok(found) => Ok(Ok(found)),
        Err(kube::Error::Api(ae)) if ae.code == 403 => {
            Ok(Err(crate::template::TemplateUnusable::Forbidden {
                what,
                message: ae.message,
                resource: reference.kind.resource(),
            }))
        }
        Err(e) => Err(kube_err(format!("get {what}"))(e)),
    }
}

/// The labels of namespace `name` (none when it has none).
pub(crate) async fn namespace_labels(
    client: &Client,
    name: &str,
) -> Result<std::collections::BTreeMap<String, String>, ControllerError> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = namespaces
        .get(name)
        .await
        .map_err(kube_err(format!("get namespace {name}")))?;
    Ok(ns.metadata.labels.unwrap_or_default())
}

/// The image of `pod`'s workload container, resolved without pulling it (the pre-flight of
/// `--preflight-images`, docs/contract.md ADR-006 §5) with the credentials of the pod's
/// imagePullSecrets (the run's and the operator's, read in the run's namespace; one that cannot
/// be read only makes a private image unverifiable): the image and what its registry said.
pub(crate) async fn resolve_image(
    client: &Client,
    resolver: &ImageResolver,
    namespace: &str,
    pod: &Pod,
) -> (String, Resolution) {
    let spec = pod.spec.as_ref();
    let image = spec
        .and_then(|s| s.containers.iter().find(|c| c.name == WORKLOAD_CONTAINER))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let secrets: Vec<String> = spec
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    let creds = pull_credentials(client, namespace, &secrets).await;
    let resolution = resolver.resolve(&image, creds.as_ref()).await;
    (image, resolution)
}

/// The cause a Pending pod's Warning Events give for not starting (FailedMount, …), reading at
/// most [`POD_EVENTS_LIMIT`] of them. A failed read is logged and counts as no cause.
async fn stuck_problem_from_events(client: &Client, ns: &str, pod: &Pod) -> Option<PodProblem> {
    let uid = pod.metadata.uid.as_deref()?;
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default()
        .fields(&format!("involvedObject.uid={uid},type=Warning"))
        .limit(POD_EVENTS_LIMIT);
    let list = match api.list(&params).await {
        Ok(l) => l,
        Err(e) => {
            warn!(pod = ?pod.metadata.name, error = %e, "could not read the pod's Events");
            return None;
        }
    };
    let facts: Vec<PodEventFact> = list
        .items
        .into_iter()
        .map(|e| PodEventFact {
            last_seen: e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0)),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect();
    stuck_from_events(&facts)
}

/// Where the drained archives of a run go: the store, its key prefix and its URL.
pub(crate) struct StoreView<'a> {
    /// The store.
    pub store: &'a Arc<dyn ObjectStore>,
    /// Key prefix inside it.
    pub prefix: &'a object_store::path::Path,
    /// Its URL (for object URLs in status).
    pub url: &'a str,
}

/// The status entries of the run's undrained paths whose manifest is already in the store (an
/// operator committed them and died before recording it). A manifest that cannot be read is not
/// taken for one: the path stays undrained (and is reported lost), with a warning.
pub(crate) async fn committed_entries(
    store: &StoreView<'_>,
    (run_ref, run): (&RunId, &SandboxRun),
) -> Vec<ReadBackStatus> {
    let compression = run.spec.compression();
    let undrained = undrained_paths(run);
    let mut committed = Vec::new();
    for (index, declared) in run.spec.read_back_paths().iter().enumerate() {
        if !undrained.contains(&declared.path.as_str()) {
            continue;
        }
        let keys =
            crate::store::object_keys(store.prefix, run_ref, index, &declared.path, compression);
        match crate::store::try_read_manifest(store.store, &keys.manifest).await {
            Ok(Some(manifest)) => committed.push(crate::drain::path_drain::committed_status(
                &declared.path,
                &manifest,
                &keys,
                store.url,
                manifest.attempt,
            )),
            Ok(None) => {}
            Err(e) => {
                warn!(path = %declared.path, error = %e, "could not read the manifest of a path whose pod is gone");
            }
        }
    }
    committed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pod_view::WorkloadState;
    use crate::controller::testkit::fixtures::at;

    fn pod(uid: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.into());
        pod
    }

    fn pending() -> PodView {
        PodView {
            deleting: false,
            holder_running: false,
            workload: WorkloadState::NotStarted,
            started_at: None,
            pending_since: Some(at(0)),
            problem: None,
            host_ip: None,
            gate_waiting: false,
        }
    }

    #[test]
    fn at_most_two_pods_events_are_read_at_once_and_a_pods_not_again_before_its_pause() {
        let reads = EventReads::default();
        let view = pending();
        let now = |r: &Option<EventsRead<'_>>| matches!(r, Some(EventsRead::Now(..)));
        let first = reads.take(&pod("a"), &view, at(5));
        let second = reads.take(&pod("b"), &view, at(5));
        assert!(now(&first) && now(&second), "two slots");
        // Both slots are taken: c goes on with what it knew (nothing yet).
        assert!(matches!(
            reads.take(&pod("c"), &view, at(5)),
            Some(EventsRead::Kept(None))
        ));
        drop(first);
        assert!(now(&reads.take(&pod("c"), &view, at(5))), "a slot freed");
        drop(second);
        // a was read at 5 s: not again before 10 s, whatever the slots.
        assert!(matches!(
            reads.take(&pod("a"), &view, at(6)),
            Some(EventsRead::Kept(_))
        ));
        assert!(now(&reads.take(&pod("a"), &view, at(10))));
        // A pod without a uid is never read (nothing to remember it by).
        assert!(reads.take(&Pod::default(), &view, at(60)).is_none());
    }

    /// A reconcile between two reads keeps the problem the last read found: the run's status
    /// does not lose it and find it again (the real-node test saw the cause told four times).
    #[test]
    fn between_two_reads_a_pod_keeps_the_problem_its_last_read_found() {
        let reads = EventReads::default();
        let view = pending();
        let stuck = PodProblem::Stuck {
            reason: "FailedMount",
            message: "configmap \"no-such-config\" not found".into(),
        };
        let Some(EventsRead::Now(uid, slot)) = reads.take(&pod("a"), &view, at(5)) else {
            panic!("the first read is due");
        };
        reads.found(uid, Some(stuck.clone()));
        drop(slot);
        match reads.take(&pod("a"), &view, at(7)) {
            Some(EventsRead::Kept(kept)) => assert_eq!(kept, Some(stuck.clone())),
            _ => panic!("not due again before 10 s"),
        }
        // A started pod's Events are not read nor kept.
        let mut started = pending();
        started.workload = WorkloadState::Running;
        assert!(reads.take(&pod("a"), &started, at(7)).is_none());
    }
}
