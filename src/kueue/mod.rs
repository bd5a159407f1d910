//! Queueing through Kueue (docs/user-guide.md "Queueing with Kueue", issue #41): a run labelled
//! `kueue.x-k8s.io/queue-name` gets a Kueue **Workload** (Kueue's API for a job kind it does not
//! know: docs/architecture.md "Kueue") that asks for its pod's real resource needs, and gets no
//! pod until Kueue admits that Workload. Everything here is pure: the Workload the operator
//! creates, what a Workload read from the apiserver says ([`QueueState`]), and the status patches
//! the operator writes on it (finished; evicted and stopped, so Kueue may queue it again).
//!
//! Written as Kueue's own job integrations write theirs (`jobframework` in Kueue v0.17): the
//! Workload is owned by the run (garbage collected with it), named after it, with one pod set of
//! one pod whose template is the pod the operator would create; Finished=True when the run ends
//! releases its quota; after an eviction (preemption) whose pod is gone, the admission is cleared
//! (QuotaReserved=False `Pending`, Requeued=True) so Kueue queues it again.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::discovery::ApiResource;
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::api::SandboxRun;
use crate::identity::RunId;

pub(crate) mod gate;

/// The label that puts a run in a Kueue LocalQueue of its namespace.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label naming a run's WorkloadPriorityClass.
pub const PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// The condition a queued run gets while its Kueue labels disagree with what it was queued
/// with (docs/contract.md "A queued run keeps the queue and priority it was queued with").
pub const LABEL_EDIT_IGNORED: &str = "LabelEditIgnored";
/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The Workload API version this operator writes (Kueue v0.17's storage version).
pub const VERSION: &str = "v1beta2";
/// The one pod set of a run's Workload.
pub const POD_SET: &str = "main";

/// One of Kueue's resources, of [`VERSION`].
fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_string(),
        version: VERSION.to_string(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// The Workload resource.
pub fn workload_resource() -> ApiResource {
    resource("Workload", "workloads")
}

/// The WorkloadPriorityClass resource (cluster-scoped).
pub fn priority_class_resource() -> ApiResource {
    resource("WorkloadPriorityClass", "workloadpriorityclasses")
}

/// The ResourceFlavor resource (cluster-scoped).
pub fn flavor_resource() -> ApiResource {
    resource("ResourceFlavor", "resourceflavors")
}

/// The ResourceFlavors an admitted Workload's pod set was given, each once, in order.
pub fn admitted_flavors(workload: &Value) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let sets = workload["status"]["admission"]["podSetAssignments"].as_array();
    for set in sets.into_iter().flatten() {
        for name in set["flavors"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| v.as_str())
        {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// `pod` as Kueue makes its own jobs' pods on admission: each admitted flavor's `nodeLabels`
/// added to its nodeSelector (the flavor's value wins: Kueue assigned the flavor knowing the
/// pod's own selector) and its `tolerations` added.
pub fn with_flavors(mut pod: Pod, flavors: &[Value]) -> Pod {
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    for flavor in flavors {
        let labels = flavor["spec"]["nodeLabels"].as_object();
        for (k, v) in labels.into_iter().flatten() {
            if let Some(v) = v.as_str() {
                spec.node_selector
                    .get_or_insert_with(Default::default)
                    .insert(k.clone(), v.to_string());
            }
        }
        let tolerations: Vec<k8s_openapi::api::core::v1::Toleration> =
            serde_json::from_value(flavor["spec"]["tolerations"].clone()).unwrap_or_default();
        for t in tolerations {
            let list = spec.tolerations.get_or_insert_with(Vec::new);
            if !list.contains(&t) {
                list.push(t);
            }
        }
    }
    pod
}

/// The LocalQueue a run asks for, when it is labelled with one.
pub fn queue_of(run: &SandboxRun) -> Option<&str> {
    run.labels()
        .get(QUEUE_LABEL)
        .map(String::as_str)
        .filter(|q| !q.is_empty())
}

/// The refusal of an edit of a run's `kueue.x-k8s.io/queue-name` label once the run was queued
/// (docs/contract.md "Quota cannot be edited away"): `recorded` is the queue its status recorded
/// when its Workload was made, `new_label` the label the edit leaves. An object being let go of
/// (`letting_go`: deleted, or stopped by this edit) is never refused: the operator keys on what
/// it recorded whatever the label says.
pub fn label_change_refusal(
    recorded: Option<&str>,
    new_label: Option<&str>,
    letting_go: bool,
) -> Option<String> {
    let recorded = recorded.filter(|q| !q.is_empty())?;
    if letting_go || new_label == Some(recorded) {
        return None;
    }
    let now = match new_label {
        Some(label) => format!("changes it to {label:?}"),
        None => "removes it".to_string(),
    };
    Some(format!(
        "the run was queued in Kueue LocalQueue {recorded:?}; this edit {now}, and the queue a run was queued in cannot change (its quota is held there)"
    ))
}

/// The refusal of an edit of a run's `kueue.x-k8s.io/priority-class` label once the run was
/// queued in `recorded` (docs/contract.md "A queued run keeps the queue and priority it was
/// queued with"): `old_label` and `new_label` are the label before and after the edit. Never
/// refused: a run being let go of, and an edit of a run whose labels disagree already with its
/// Workload (`disagrees`: the operator said so, the webhook having been bypassed), so that the
/// label can be put back.
pub fn priority_change_refusal(
    recorded: Option<&str>,
    (old_label, new_label): (Option<&str>, Option<&str>),
    letting_go: bool,
    disagrees: bool,
) -> Option<String> {
    let recorded = recorded.filter(|q| !q.is_empty())?;
    if letting_go || disagrees || old_label == new_label {
        return None;
    }
    let now = match new_label {
        Some(label) => format!("changes it to {label:?}"),
        None => "removes it".to_string(),
    };
    let was = old_label.map_or_else(|| "none".to_string(), |l| format!("{l:?}"));
    Some(format!(
        "the run was queued in Kueue LocalQueue {recorded:?} with WorkloadPriorityClass {was}; this edit {now}, and the priority a run was queued with cannot change"
    ))
}

/// The WorkloadPriorityClass a run names, when it does.
pub fn priority_class_of(run: &SandboxRun) -> Option<&str> {
    run.labels()
        .get(PRIORITY_LABEL)
        .map(String::as_str)
        .filter(|q| !q.is_empty())
}

/// The name of a run's Workload: its first pod's name (another kind, so never a clash).
pub fn workload_name(run_name: &str) -> String {
    crate::names::pod_name(run_name)
}

/// A WorkloadPriorityClass the run names: its name and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Priority {
    /// The class's name.
    pub name: String,
    /// Its `value`.
    pub value: i64,
}

/// The Workload of the run `run` in `queue`, asking for `pod`'s resources (its containers, init
/// containers and overhead, as Kueue sums them), owned by the run (its uid: never an empty
/// one). Written fully defaulted: Kueue's defaulting webhook may not run.
pub fn build(run: &RunId, queue: &str, pod: &Pod, priority: Option<&Priority>) -> Value {
    let name = &run.name;
    let mut template_spec =
        serde_json::to_value(pod.spec.clone().unwrap_or_default()).unwrap_or_else(|_| json!({}));
    // The template says what the pod needs, not where it is: no node name.
    if let Some(spec) = template_spec.as_object_mut() {
        spec.remove("nodeName");
    }
    let mut spec = json!({
        "queueName": queue,
        "active": true,
        "podSets": [{
            "name": POD_SET,
            "count": 1,
            "template": {"spec": template_spec},
        }],
    });
    if let (Some(priority), Some(obj)) = (priority, spec.as_object_mut()) {
        obj.insert("priority".into(), json!(priority.value));
        obj.insert(
            "priorityClassRef".into(),
            json!({"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority.name}),
        );
    }
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Workload",
        "metadata": {
            "name": workload_name(name),
            "namespace": run.namespace,
            "labels": {
                crate::names::MANAGED_BY_LABEL: crate::names::MANAGED_BY,
                crate::names::RUN_UID_LABEL: run.uid,
            },
            "ownerReferences": [{
                "apiVersion": "sandbox.iterion.io/v1alpha1",
                "kind": "SandboxRun",
                "name": name,
                "uid": run.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    })
}

/// What a run's Workload says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// No Workload yet.
    Absent,
    /// A Workload of that name that this run does not own: never used.
    Foreign,
    /// Waiting for quota: Kueue's reason and words (QuotaReserved=False), or none yet.
    Pending {
        /// Kueue's reason (e.g. `Pending`), or `Created` before Kueue looked at it.
        reason: String,
        /// Kueue's words.
        message: String,
    },
    /// Admitted: the pod may be created.
    Admitted {
        /// The ClusterQueue that admitted it.
        cluster_queue: String,
    },
    /// Evicted (e.g. preempted): the pod must go; `admitted`: its admission is still set (the
    /// operator clears it once the pod is gone).
    Evicted {
        /// Kueue's reason (e.g. `Preempted`).
        reason: String,
        /// Kueue's words.
        message: String,
        /// Whether the quota is still reserved.
        admitted: bool,
    },
    /// Finished=True: its quota is released.
    Finished,
}

fn condition<'a>(workload: &'a Value, type_: &str) -> Option<&'a Value> {
    workload["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"].as_str() == Some(type_))
}

fn is_true(workload: &Value, type_: &str) -> bool {
    condition(workload, type_).is_some_and(|c| c["status"].as_str() == Some("True"))
}

fn words(c: Option<&Value>, field: &str) -> String {
    c.and_then(|c| c[field].as_str())
        .unwrap_or_default()
        .to_string()
}

/// What `workload` (None: there is none) says to the run with `run_uid`.
pub fn state_of(workload: Option<&Value>, run_uid: &str) -> QueueState {
    let Some(w) = workload else {
        return QueueState::Absent;
    };
    let owned = w["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(run_uid)));
    if !owned {
        return QueueState::Foreign;
    }
    if is_true(w, "Finished") {
        return QueueState::Finished;
    }
    let reserved = !w["status"]["admission"].is_null() && is_true(w, "QuotaReserved");
    if is_true(w, "Evicted") {
        let c = condition(w, "Evicted");
        return QueueState::Evicted {
            reason: words(c, "reason"),
            message: words(c, "message"),
            admitted: reserved,
        };
    }
    if reserved && is_true(w, "Admitted") {
        return QueueState::Admitted {
            cluster_queue: w["status"]["admission"]["clusterQueue"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
    }
    let c = condition(w, "QuotaReserved");
    QueueState::Pending {
        reason: c.map_or_else(|| "Created".to_string(), |_| words(c, "reason")),
        message: c.map_or_else(
            || "waiting for Kueue to look at its Workload".to_string(),
            |_| words(c, "message"),
        ),
    }
}

/// `conditions` with the condition `type_` set (its transition time kept when its status did
/// not change), as Kueue's `apimeta.SetStatusCondition` does.
fn with_condition(
    conditions: &[Value],
    (type_, status, reason, message): (&str, bool, &str, &str),
    generation: i64,
    now: Timestamp,
) -> Vec<Value> {
    let status = if status { "True" } else { "False" };
    let mut out: Vec<Value> = conditions.to_vec();
    let kept_time = out
        .iter()
        .find(|c| c["type"].as_str() == Some(type_) && c["status"].as_str() == Some(status))
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string));
    out.retain(|c| c["type"].as_str() != Some(type_));
    out.push(json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": crate::text::prefix(message, 32_768),
        "observedGeneration": generation,
        "lastTransitionTime": kept_time.unwrap_or_else(|| now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
    }));
    out
}

fn conditions_and_generation(workload: &Value) -> (Vec<Value>, i64) {
    (
        workload["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        workload["metadata"]["generation"].as_i64().unwrap_or(1),
    )
}

/// The merge patch of `workload`'s status that marks it Finished (the run ended): Kueue
/// releases its quota. Carries the Workload's resourceVersion: a Workload changed since it was
/// read is refused (409) and read again.
pub fn finished_patch(workload: &Value, succeeded: bool, message: &str, now: Timestamp) -> Value {
    let (conditions, generation) = conditions_and_generation(workload);
    let reason = if succeeded { "Succeeded" } else { "Failed" };
    json!({
        "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
        "status": {"conditions": with_condition(
            &conditions, ("Finished", true, reason, message), generation, now)},
    })
}

/// Kueue's words for PodsReady (`jobframework`'s `generatePodsReadyCondition`).
const PODS_READY_WORDS: &str = "All pods reached readiness and the workload is running";
const PODS_NOT_READY_WORDS: &str = "Not all pods are ready or succeeded";
const PODS_RECOVERING_WORDS: &str = "At least one pod has failed, waiting for recovery";

/// The PodsReady condition an admitted `workload` should carry when its pod is (`ready`) or is
/// not ready: status, reason and words, as Kueue's `jobframework` decides them
/// (`Started`/`Recovered` when ready; `WaitForStart` before it ever was; `WaitForRecovery` once
/// it was and is no more).
fn pods_ready_condition(workload: &Value, ready: bool) -> (bool, &'static str, &'static str) {
    let was = condition(workload, "PodsReady");
    let reason = was.and_then(|c| c["reason"].as_str()).unwrap_or_default();
    let was_true = was.is_some_and(|c| c["status"].as_str() == Some("True"));
    match (ready, was_true, reason) {
        (true, _, "WaitForRecovery" | "Recovered") => (true, "Recovered", PODS_READY_WORDS),
        (true, _, _) => (true, "Started", PODS_READY_WORDS),
        (false, true, _) | (false, false, "WaitForRecovery") => {
            (false, "WaitForRecovery", PODS_RECOVERING_WORDS)
        }
        (false, false, _) => (false, "WaitForStart", PODS_NOT_READY_WORDS),
    }
}

/// The merge patch of an admitted `workload`'s status that says whether its pod is ready
/// (PodsReady, as Kueue's own integrations write it: with `waitForPodsReady` on, Kueue evicts a
/// Workload that is not PodsReady=True within its timeout); None when it says so already.
/// Carries the Workload's resourceVersion (a changed Workload is read again).
pub fn pods_ready_patch(workload: &Value, ready: bool, now: Timestamp) -> Option<Value> {
    let (status, reason, message) = pods_ready_condition(workload, ready);
    let said = condition(workload, "PodsReady").is_some_and(|c| {
        c["status"].as_str() == Some(if status { "True" } else { "False" })
            && c["reason"].as_str() == Some(reason)
    });
    if said {
        return None;
    }
    let (conditions, generation) = conditions_and_generation(workload);
    Some(json!({
        "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
        "status": {"conditions": with_condition(
            &conditions, ("PodsReady", status, reason, message), generation, now)},
    }))
}

/// Whether `workload` is active (`spec.active`, true when unset): Kueue evicts an inactive
/// Workload (`Evicted` reason `Deactivated`) and admits it no more.
pub fn is_active(workload: &Value) -> bool {
    workload["spec"]["active"].as_bool() != Some(false)
}

/// The merge patch of a Workload that makes it `active` or not: what Kueue's integrations do to
/// a Workload whose job is suspended by its owner (Kueue then evicts it and its quota is freed)
/// and resumed (Kueue queues it again).
pub fn active_patch(active: bool) -> Value {
    json!({"spec": {"active": active}})
}

/// The merge patch of an evicted `workload`'s status once the run's pod is gone: its admission
/// cleared (QuotaReserved=False `Pending`, Admitted=False), Requeued=True when Kueue evicted it
/// to preempt it, so Kueue queues it again (what Kueue's `jobframework` does for its own jobs).
pub fn requeue_patch(workload: &Value, now: Timestamp) -> Value {
    let (mut conditions, generation) = conditions_and_generation(workload);
    let evicted = condition(workload, "Evicted");
    let (reason, message) = (words(evicted, "reason"), words(evicted, "message"));
    let requeued = matches!(reason.as_str(), "Preempted" | "NodeFailures");
    for (type_, status, why) in [
        ("Requeued", requeued, reason.as_str()),
        ("QuotaReserved", false, "Pending"),
        ("Admitted", false, "NoReservation"),
    ] {
        conditions = with_condition(&conditions, (type_, status, why, &message), generation, now);
    }
    // Not admitted: its pod is not ready, and the next admission waits for it from the start
    // (what Kueue's `jobframework` writes of a Workload that is not admitted).
    if condition(workload, "PodsReady").is_some() {
        let not_ready = ("PodsReady", false, "WaitForStart", PODS_NOT_READY_WORDS);
        conditions = with_condition(&conditions, not_ready, generation, now);
    }
    json!({
        "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
        "status": {"admission": null, "conditions": conditions},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn run() -> SandboxRun {
        crate::testkit::sandbox_run("job")
            .namespace("team")
            .uid("uid-1")
            .label(QUEUE_LABEL, "lq")
            .build()
    }

    fn pod() -> Pod {
        let requests = |cpu: &str| ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![
                    Container {
                        name: "workload".into(),
                        resources: Some(requests("500m")),
                        ..Default::default()
                    },
                    Container {
                        name: "holder".into(),
                        resources: Some(requests("10m")),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn workload(conditions: Value, admission: Value) -> Value {
        json!({
            "metadata": {"name": "job-sbr", "generation": 1, "resourceVersion": "42",
                "ownerReferences": [{"uid": "uid-1"}]},
            "status": {"conditions": conditions, "admission": admission},
        })
    }

    #[test]
    fn the_workload_asks_for_the_pods_requests_in_the_runs_queue_owned_by_the_run() {
        let priority = Priority {
            name: "high".into(),
            value: 1000,
        };
        let w = build(&RunId::of(&run()).unwrap(), "lq", &pod(), Some(&priority));
        assert_eq!(w["metadata"]["name"], "job-sbr");
        assert_eq!(w["metadata"]["namespace"], "team");
        assert_eq!(w["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(w["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(w["spec"]["queueName"], "lq");
        assert_eq!(w["spec"]["active"], true);
        let set = &w["spec"]["podSets"][0];
        assert_eq!(
            (set["name"].as_str(), set["count"].as_i64()),
            (Some("main"), Some(1))
        );
        let containers = &set["template"]["spec"]["containers"];
        assert_eq!(containers[0]["resources"]["requests"]["cpu"], "500m");
        assert_eq!(containers[1]["resources"]["requests"]["cpu"], "10m");
        assert!(set["template"]["spec"].get("nodeName").is_none());
        assert_eq!(w["spec"]["priority"], 1000);
        assert_eq!(
            w["spec"]["priorityClassRef"]["kind"],
            "WorkloadPriorityClass"
        );
        let plain = build(&RunId::of(&run()).unwrap(), "lq", &pod(), None);
        assert!(plain["spec"].get("priority").is_none());
        assert_eq!(queue_of(&run()), Some("lq"));
        let mut unlabelled = run();
        unlabelled.metadata.labels = None;
        assert_eq!(queue_of(&unlabelled), None);
    }

    #[test]
    fn an_admitted_flavors_node_labels_and_tolerations_land_on_the_pod() {
        let admitted = json!({"status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "flavors": {"cpu": "spot", "memory": "spot"}}]}}});
        assert_eq!(admitted_flavors(&admitted), ["spot"]);
        assert!(admitted_flavors(&json!({})).is_empty());
        let spot = json!({"spec": {
            "nodeLabels": {"pool": "spot", "sandbox.iterion.io/real-node": "true"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}});
        let mut p = pod();
        p.spec.as_mut().unwrap().node_selector =
            Some([("pool".to_string(), "any".to_string())].into());
        let placed = with_flavors(p, &[spot.clone(), spot]);
        let spec = placed.spec.unwrap();
        let selector = spec.node_selector.unwrap();
        assert_eq!(selector["pool"], "spot");
        assert_eq!(selector["sandbox.iterion.io/real-node"], "true");
        assert_eq!(spec.tolerations.unwrap().len(), 1, "a toleration once");
    }

    #[test]
    fn a_workload_reads_as_pending_admitted_evicted_finished_or_not_the_runs() {
        assert_eq!(state_of(None, "uid-1"), QueueState::Absent);
        let fresh = workload(json!([]), Value::Null);
        assert!(
            matches!(state_of(Some(&fresh), "uid-1"), QueueState::Pending { reason, .. } if reason == "Created")
        );
        assert_eq!(state_of(Some(&fresh), "other"), QueueState::Foreign);
        let pending = workload(
            json!([{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                "message": "couldn't assign flavors"}]),
            Value::Null,
        );
        assert_eq!(
            state_of(Some(&pending), "uid-1"),
            QueueState::Pending {
                reason: "Pending".into(),
                message: "couldn't assign flavors".into()
            }
        );
        let admission = json!({"clusterQueue": "cq", "podSetAssignments": []});
        let admitted = workload(
            json!([{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                   {"type": "Admitted", "status": "True", "reason": "Admitted"}]),
            admission.clone(),
        );
        assert_eq!(
            state_of(Some(&admitted), "uid-1"),
            QueueState::Admitted {
                cluster_queue: "cq".into()
            }
        );
        let evicted = workload(
            json!([{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                   {"type": "Admitted", "status": "True", "reason": "Admitted"},
                   {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "to accommodate"}]),
            admission,
        );
        assert_eq!(
            state_of(Some(&evicted), "uid-1"),
            QueueState::Evicted {
                reason: "Preempted".into(),
                message: "to accommodate".into(),
                admitted: true
            }
        );
        // The operator's requeue patch clears the admission: still evicted, no longer reserved.
        let patch = requeue_patch(&evicted, Timestamp::UNIX_EPOCH);
        assert!(patch["status"]["admission"].is_null());
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let mut requeued = evicted.clone();
        requeued["status"] = patch["status"].clone();
        assert_eq!(
            state_of(Some(&requeued), "uid-1"),
            QueueState::Evicted {
                reason: "Preempted".into(),
                message: "to accommodate".into(),
                admitted: false
            }
        );
        let conditions = requeued["status"]["conditions"].as_array().unwrap();
        let of = |t: &str| conditions.iter().find(|c| c["type"] == t).unwrap()["status"].clone();
        assert_eq!(
            (of("Requeued"), of("QuotaReserved"), of("Admitted")),
            (json!("True"), json!("False"), json!("False"))
        );
        let finished = finished_patch(&admitted, true, "done", Timestamp::UNIX_EPOCH);
        let mut done = admitted.clone();
        done["status"]["conditions"] = finished["status"]["conditions"].clone();
        assert_eq!(state_of(Some(&done), "uid-1"), QueueState::Finished);
        assert_eq!(finished["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn pods_ready_follows_kueues_integrations_started_waiting_and_recovering() {
        let admitted = workload(
            json!([{"type": "Admitted", "status": "True", "reason": "Admitted"}]),
            json!({"clusterQueue": "cq"}),
        );
        let apply = |w: &Value, ready: bool| -> Option<Value> {
            let patch = pods_ready_patch(w, ready, Timestamp::UNIX_EPOCH)?;
            let mut next = w.clone();
            next["status"]["conditions"] = patch["status"]["conditions"].clone();
            Some(next)
        };
        let said = |w: &Value| {
            let c = condition(w, "PodsReady").expect("PodsReady");
            (c["status"].clone(), c["reason"].clone())
        };
        let waiting = apply(&admitted, false).expect("written");
        assert_eq!(said(&waiting), (json!("False"), json!("WaitForStart")));
        assert_eq!(apply(&waiting, false), None, "said once");
        let started = apply(&waiting, true).expect("written");
        assert_eq!(said(&started), (json!("True"), json!("Started")));
        assert_eq!(apply(&started, true), None);
        let lost = apply(&started, false).expect("written");
        assert_eq!(said(&lost), (json!("False"), json!("WaitForRecovery")));
        let back = apply(&lost, true).expect("written");
        assert_eq!(said(&back), (json!("True"), json!("Recovered")));
    }

    #[test]
    fn once_queued_the_priority_label_cannot_change_unless_let_go_of_or_put_back() {
        let refusal = |old, new, letting_go, disagrees| {
            priority_change_refusal(Some("lq"), (old, new), letting_go, disagrees)
        };
        assert_eq!(
            priority_change_refusal(None, (Some("low"), Some("high")), false, false),
            None,
            "never queued"
        );
        assert_eq!(refusal(Some("low"), Some("low"), false, false), None);
        let raised = refusal(Some("low"), Some("high"), false, false).expect("refused");
        assert!(
            raised.contains("\"low\"") && raised.contains("\"high\""),
            "{raised}"
        );
        let removed = refusal(Some("low"), None, false, false).expect("refused");
        assert!(removed.contains("removes it"), "{removed}");
        assert!(refusal(None, Some("high"), false, false).is_some(), "added");
        assert_eq!(refusal(Some("low"), None, true, false), None, "let go of");
        assert_eq!(
            refusal(Some("high"), Some("low"), false, true),
            None,
            "put back"
        );
    }

    #[test]
    fn once_queued_the_queue_label_cannot_be_removed_or_changed_but_a_run_is_always_let_go_of() {
        assert_eq!(
            label_change_refusal(None, None, false),
            None,
            "never queued"
        );
        assert_eq!(label_change_refusal(Some("lq"), Some("lq"), false), None);
        let removed = label_change_refusal(Some("lq"), None, false).expect("refused");
        assert!(
            removed.contains("\"lq\"") && removed.contains("removes it"),
            "{removed}"
        );
        let moved = label_change_refusal(Some("lq"), Some("free"), false).expect("refused");
        assert!(moved.contains("\"free\""), "{moved}");
        assert_eq!(
            label_change_refusal(Some("lq"), None, true),
            None,
            "a stop or a deletion is never refused"
        );
    }
}
