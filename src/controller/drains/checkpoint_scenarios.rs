//! Scenarios for a checkpoint (`checkpoint::checkpoint`, as the drain pool runs it) against
//! a routing mock apiserver, with sharding on: a checkpoint is fenced like a teardown
//! (docs/contract.md "Checkpoints are fenced like teardowns").

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
use object_store::memory::InMemory;
use serde_json::{json, Value};

use super::checkpoint::checkpoint;
use super::teardown_scenarios::pod;
use crate::api::{Phase, SandboxRunStatus};
use crate::controller::run::pipeline_scenarios::run;
use crate::controller::testkit::mock_apiserver::{apiserver, context, Route};
use crate::pod::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};
use crate::shard::drain_claim::{drain_claim_name, DrainClaims};
use crate::shard::replica_lease_name;

const RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/op/leases";

fn lease(name: &str, holder: &str) -> Value {
    serde_json::to_value(Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("op".into()),
            resource_version: Some("3".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    })
    .unwrap()
}

fn running(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_checkpoint_of_a_run_another_live_replica_drains_reads_and_writes_nothing() {
    let mut r = run();
    r.spec.checkpoint = Some("c1".into());
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Running),
        pod_name: Some("demo-sbr".into()),
        ..Default::default()
    });
    let pod = pod(vec![running(WORKLOAD_CONTAINER), running(HOLDER_CONTAINER)]);
    let claim = drain_claim_name("grp", "u1");
    let heartbeat = replica_lease_name("grp", "other");
    let routes = vec![
        // Leases are read by a list selecting the name (src/shard/drain_claim.rs).
        Route::with("GET", LEASES, move |seen| {
            let items: Vec<Value> = [&claim, &heartbeat]
                .into_iter()
                .filter(|name| seen.uri.contains(name.as_str()))
                .map(|name| lease(name, "other"))
                .collect();
            (
                200,
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                "metadata": {}, "items": items}),
            )
        }),
        Route::fixed("GET", RUN, 200, serde_json::to_value(&r).unwrap()),
        Route::fixed(
            "GET",
            &format!("{PODS}/demo-sbr"),
            200,
            serde_json::to_value(&pod).unwrap(),
        ),
        Route::any(200, serde_json::json!({})),
    ];
    let (client, log) = apiserver(routes);
    let claims = DrainClaims::new(client.clone(), "op", "grp", "me", Duration::from_secs(15));
    let ctx = context(client, Arc::new(InMemory::new())).with_drain_claims(Some(Arc::new(claims)));
    // Bounded: a drain that went ahead would retry its exec until the drain timeout.
    let ended = tokio::time::timeout(Duration::from_secs(5), checkpoint(&ctx, &r)).await;
    let lines = log.lines();
    assert!(
        lines.iter().all(|l| *l == format!("GET {LEASES}")),
        "only the claim and its holder's heartbeat are read: {lines:?}"
    );
    assert!(!lines.is_empty(), "the claim is asked: {lines:?}");
    assert!(matches!(ended, Ok(Ok(()))), "it ends at once: {ended:?}");
}
