//! `run --preflight-images` on the real control plane (docs/contract.md ADR-006 §5): before the
//! operator creates a run's pod it asks the test bed's registry for the image's manifest, never
//! pulling it. A tag the registry does not have fails the run at once (`ImageUnresolvable`, no
//! pod ever); an image it has gets its pod; a registry that cannot be reached is a Warning Event
//! and the pod is created anyway. kwok plays the node, so no pod ever pulls: what is shown is the
//! operator's own decision.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::Api;
use sandboxrun_operator::api::{Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::pod;

use crate::support::*;

/// The run's condition `type_` as (status, reason).
fn condition(run: &SandboxRun, type_: &str) -> Option<(String, String)> {
    run.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn pair(status: &str, reason: &str) -> Option<(String, String)> {
    Some((status.to_string(), reason.to_string()))
}

/// Deletes the runs while the operator still runs (it releases their finalizers, draining the
/// started ones), so the test namespace can go once the test ends.
async fn delete_runs(runs: &Api<SandboxRun>, names: &[&str], op: &Operator) {
    for name in names {
        let _ = runs.delete(name, &DeleteParams::default()).await;
    }
    for name in names {
        wait_gone(runs, name, op, Duration::from_secs(60)).await;
    }
}

#[tokio::test]
async fn a_missing_tag_fails_the_run_without_a_pod_and_an_existing_image_gets_its_pod() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "preflight").await;
    let (_store_dir, store_url) = file_store("preflight");
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&["--preflight-images"])
        .start();
    // The operator runs on this host, where the bed's registry is on loopback (plain HTTP).
    let registry = bed_setting("SANDBOXRUN_TEST_REGISTRY");
    let out = host_dir("preflight-out");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let missing = format!("{registry}/busybox:no-such-tag-{}", rand_u32());
    create(&runs, "missing", spec(&[&out]).image(&missing)).await;
    create(
        &runs,
        "present",
        spec(&[&out]).image(&format!("{registry}/busybox:1.35")),
    )
    .await;

    let failed = wait_phase(&runs, "missing", Phase::Failed, &op).await;
    assert_eq!(
        condition(&failed, "Failed"),
        pair("True", "ImageUnresolvable")
    );
    assert_eq!(
        condition(&failed, "Ready"),
        pair("False", "ImageUnresolvable")
    );
    let status = failed.status.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains(&missing) && message.contains("hint:"),
        "the message names the image and the remedy: {message}"
    );
    assert_eq!(status.pod_name, None, "no pod was ever named");
    assert_eq!(
        status.read_back.iter().map(|e| e.phase).collect::<Vec<_>>(),
        [ReadBackPhase::Empty],
        "the workload never ran: nothing to drain, not a drain failure"
    );
    let event = wait_event(
        &client,
        &ns.name,
        Some("missing"),
        "ImageUnresolvable",
        Duration::from_secs(20),
        &op,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(note.contains("push the image"), "{note}");

    // The image the registry has: its pod is created and the run starts (kwok runs it).
    let started = wait_phase(&runs, "present", Phase::Running, &op).await;
    let pod_name = pod_of(&started);
    assert!(pods.get_opt(&pod_name).await.ok().flatten().is_some());
    assert!(
        events_of(&client, &ns.name, "present", "ImageUnverified")
            .await
            .is_empty(),
        "a resolvable image is not warned about"
    );

    // The failed run never gets a pod, however long it is looked at.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        pods.get_opt(&pod::pod_name("missing"))
            .await
            .ok()
            .flatten()
            .is_none(),
        "a pod was created for an image that does not resolve"
    );
    let still = runs.get("missing").await.unwrap();
    assert_eq!(
        still.status.and_then(|s| s.phase),
        Some(Phase::Failed),
        "the run stays Failed"
    );
    delete_runs(&runs, &["missing", "present"], &op).await;
}

#[tokio::test]
async fn an_unreachable_registry_is_a_warning_and_the_pod_is_created_anyway() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "preflight-down").await;
    let (_store_dir, store_url) = file_store("preflight-down");
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&["--preflight-images"])
        .start();
    // Nothing listens there: the connection is refused, which proves nothing about the image.
    let image = format!("127.0.0.1:{}/team/app:v1", free_port());
    let out = host_dir("preflight-down-out");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "unverified", spec(&[&out]).image(&image)).await;

    let event = wait_event(
        &client,
        &ns.name,
        Some("unverified"),
        "ImageUnverified",
        Duration::from_secs(30),
        &op,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&image) && note.contains("created anyway"),
        "{note}"
    );
    let running = wait_phase(&runs, "unverified", Phase::Running, &op).await;
    assert!(running
        .status
        .and_then(|s| s.pod_name)
        .is_some_and(|p| p == pod::pod_name("unverified")));
    assert!(
        events_of(&client, &ns.name, "unverified", "ImageUnresolvable")
            .await
            .is_empty()
    );
    delete_runs(&runs, &["unverified"], &op).await;
}

/// The flag's opposite: without `--preflight-images` the same missing tag gets its pod (the
/// kubelet is left to find out), so the test above shows the flag's doing.
#[tokio::test]
async fn without_the_flag_a_missing_tag_still_gets_its_pod() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "preflight-off").await;
    let (_store_dir, store_url) = file_store("preflight-off");
    let op = Operator::builder(&ns.name, &store_url).start();
    let registry = bed_setting("SANDBOXRUN_TEST_REGISTRY");
    let out = host_dir("preflight-off-out");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let missing = format!("{registry}/busybox:no-such-tag-{}", rand_u32());
    create(&runs, "unchecked", spec(&[&out]).image(&missing)).await;
    let started = wait_phase(&runs, "unchecked", Phase::Running, &op).await;
    assert_eq!(pod_of(&started), pod::pod_name("unchecked"));
    delete_runs(&runs, &["unchecked"], &op).await;
}
