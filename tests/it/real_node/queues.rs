//! Kueue on the real node: its cluster-wide objects made and deleted, a run's Workload finished.

use super::*;

/// Waits (up to 60 s) until the Kueue Workload `name` in `ns` is Finished.
pub(super) async fn workload_finished(client: &Client, ns: &str, name: &str) {
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    eventually(
        "its Workload to be Finished",
        Duration::from_secs(60),
        || {
            let workloads = workloads.clone();
            async move {
                let w = workloads.get(name).await.ok()?;
                let conditions = w.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Finished" && c["status"] == "True")
                    .then_some(())
            }
        },
    )
    .await
}

/// Deletes the cluster-scoped objects [`kueue_queue`] made (the flavor, the ClusterQueue, the
/// priority classes), last made first; the namespaced ones go with the test's namespace.
pub(super) async fn delete_kueue_cluster_objects(
    client: &Client,
    made: Vec<(ApiResource, Option<String>, String)>,
) {
    for (res, namespace, name) in made.into_iter().rev() {
        if namespace.is_none() {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &res);
            let _ = api.delete(&name, &Default::default()).await;
        }
    }
}

/// Kueue's objects for [`super::kueue::runs_queue_through_real_kueue_and_a_preempted_run_is_drained_and_retried`]:
/// a flavor, a ClusterQueue with `cpu` quota for two runs (300m workload + 10m holder each; memory
/// plenty) that
/// preempts lower priorities within itself, a LocalQueue in `ns`, and two priority classes. Written
/// fully defaulted: Kueue's webhooks do not run on the bed (hack/kueue.sh).
pub(super) async fn kueue_queue(
    client: &Client,
    ns: &str,
    tag: &str,
) -> Vec<(ApiResource, Option<String>, String)> {
    let ar = |kind: &str, plural: &str| ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let objects = [
        (
            ar("ResourceFlavor", "resourceflavors"),
            None,
            // Its node label is the real node's own: Kueue's placement lands on the pod.
            json!({"metadata": {"name": format!("{tag}-flavor")},
                "spec": {"nodeLabels": {"kubernetes.io/hostname": "real-node-0"}}}),
        ),
        (
            ar("ClusterQueue", "clusterqueues"),
            None,
            json!({
                "metadata": {"name": format!("{tag}-cq")},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "queueingStrategy": "BestEffortFIFO",
                    "stopPolicy": "None",
                    "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
                    "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never",
                        "borrowWithinCohort": {"policy": "Never"}},
                    "resourceGroups": [{
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": format!("{tag}-flavor"),
                            "resources": [{"name": "cpu", "nominalQuota": "700m"},
                                          {"name": "memory", "nominalQuota": "4Gi"}]}],
                    }],
                },
            }),
        ),
        (
            ar("LocalQueue", "localqueues"),
            Some(ns.to_string()),
            json!({
                "metadata": {"name": "lq", "namespace": ns},
                "spec": {"clusterQueue": format!("{tag}-cq"), "stopPolicy": "None"},
            }),
        ),
        (
            ar("WorkloadPriorityClass", "workloadpriorityclasses"),
            None,
            json!({"metadata": {"name": format!("{tag}-low")}, "value": 10}),
        ),
        (
            ar("WorkloadPriorityClass", "workloadpriorityclasses"),
            None,
            json!({"metadata": {"name": format!("{tag}-high")}, "value": 1000}),
        ),
    ];
    let mut made = Vec::new();
    for (res, namespace, mut body) in objects {
        body["apiVersion"] = json!(res.api_version);
        body["kind"] = json!(res.kind);
        let name = body["metadata"]["name"].as_str().expect("name").to_string();
        let object: DynamicObject = serde_json::from_value(body).expect("object");
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &res),
            None => Api::all_with(client.clone(), &res),
        };
        api.create(&Default::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", res.kind));
        made.push((res, namespace, name));
    }
    made
}
