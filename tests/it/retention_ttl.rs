//! What happens to a run once it is over, on the real control plane (issue #11 items 7, 8):
//! `spec.ttlSecondsAfterFinished` deletes a finished run through the finalizer, and
//! `spec.readBack.retention` decides whether deleting it deletes its stored files — in the bed's
//! real S3 server, only under the run's own prefix, and never holding the run forever when the
//! store refuses. kwok plays the node; its exec runs `sandboxrun-operator pack` on this host.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use object_store::ObjectStoreExt;
use sandboxrun_operator::api::{Phase, Retention, SandboxRun, SandboxRunSpec};
use sandboxrun_operator::store::{list_manifests, run_dir, store_from_url};

use crate::support::*;

/// Waits until the apiserver serves the CRD's new fields. `ensure_crd` waits for Established, but
/// an updated schema reaches the handler a moment later, and until then the fields are pruned
/// from a created run (a run without its TTL would silently never expire).
async fn wait_fields_served(api: &Api<SandboxRun>, out: &Path) {
    let mut probe = spec(&[out]).retention(Some(Retention::Delete)).build();
    probe.ttl_seconds_after_finished = Some(2);
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        "the CRD to serve ttlSecondsAfterFinished and readBack.retention",
        Duration::from_secs(30),
        || {
            let api = api.clone();
            let run = SandboxRun::new("probe", probe.clone());
            let params = params.clone();
            async move {
                let served = api.create(&params, &run).await.ok()?;
                (served.spec.ttl_seconds_after_finished == Some(2)
                    && served.spec.read_back.and_then(|r| r.retention) == Some(Retention::Delete))
                .then_some(())
            }
        },
    )
    .await;
}

/// Runs `name` until its workload exits 0 and its drain settled (phase Succeeded).
async fn run_to_success(
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    name: &str,
    spec: impl Into<SandboxRunSpec>,
    op: &Operator,
) -> SandboxRun {
    create(runs, name, spec).await;
    run_then_finish(runs, pods, name, op).await;
    wait_phase(runs, name, Phase::Succeeded, op).await
}

/// A fresh S3 store URL (short prefix: s3s-fs names files after keys, see drain_e2e.rs).
fn s3_url(s3: &S3) -> String {
    format!("s3://{}/r{:04x}", s3.bucket, rand_u32() & 0xffff)
}

#[tokio::test]
async fn a_finished_run_with_a_ttl_is_deleted_and_keeps_its_files_while_one_without_stays() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "ttl").await;
    let dir = host_dir("store-ttl");
    let store_url = format!("file://{}", dir.display());
    let op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"kept\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_fields_served(&runs, &out).await;

    // The run without a TTL finishes first: it is over for longer than the other's TTL by the
    // time that one is gone, and must still be there.
    run_to_success(&runs, &pods, "stays", spec(&[&out]), &op).await;
    let mut short = spec(&[&out]).build();
    short.ttl_seconds_after_finished = Some(2);
    let finished = run_to_success(&runs, &pods, "short", short, &op).await;
    assert_eq!(
        finished.spec.ttl_seconds_after_finished,
        Some(2),
        "the CRD keeps the field"
    );

    wait_gone(&runs, "short", &op, PHASE_TIMEOUT).await;
    let expired = wait_event(
        &client,
        &ns.name,
        Some("short"),
        "TTLExpired",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(expired.type_.as_deref(), Some("Normal"));
    assert!(
        expired
            .note
            .as_deref()
            .is_some_and(|n| n.contains("ttlSecondsAfterFinished=2s")),
        "{expired:?}"
    );
    let stays = runs.get_opt("stays").await.unwrap();
    assert_eq!(
        stays.and_then(|r| r.status).and_then(|s| s.phase),
        Some(Phase::Succeeded),
        "a finished run without ttlSecondsAfterFinished is never deleted by the operator"
    );
    // Deleted through the finalizer with the default retention: its files stay in the store.
    crypto();
    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let manifests = list_manifests(&store, &prefix, &ns.name, "short")
        .await
        .unwrap();
    assert_eq!(manifests.len(), 1, "the expired run's manifest is kept");

    runs.delete("stays", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&runs, "stays", &op, PHASE_TIMEOUT).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn retention_delete_removes_only_the_runs_own_objects_from_s3_and_retain_keeps_them() {
    let s3 = s3();
    let options = s3.options();
    let store_url = s3_url(&s3);
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "ret").await;
    let op = Operator::builder(&ns.name, &store_url)
        .store_options(&options)
        .start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"to be deleted or kept\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_fields_served(&runs, &out).await;

    // `ab` starts with `a`: deleting `a`'s files must not touch `ab`'s.
    let a = run_to_success(
        &runs,
        &pods,
        "a",
        spec(&[&out]).retention(Some(Retention::Delete)),
        &op,
    )
    .await;
    assert_eq!(
        a.spec.read_back.as_ref().and_then(|r| r.retention),
        Some(Retention::Delete),
        "the CRD keeps the field"
    );
    let ab = run_to_success(&runs, &pods, "ab", spec(&[&out]), &op).await;
    crypto();
    let (store, prefix) = store_from_url(&store_url, &options).unwrap();
    let a_dir = run_dir(&prefix, &run_ref(&ns.name, &a));
    let ab_dir = run_dir(&prefix, &run_ref(&ns.name, &ab));
    assert_eq!(
        keys_under(&store, &a_dir).await.len(),
        2,
        "archive + manifest"
    );
    let ab_keys = keys_under(&store, &ab_dir).await;
    assert_eq!(ab_keys.len(), 2, "archive + manifest");

    runs.delete("a", &DeleteParams::default()).await.unwrap();
    runs.delete("ab", &DeleteParams::default()).await.unwrap();
    wait_gone(&runs, "a", &op, PHASE_TIMEOUT).await;
    wait_gone(&runs, "ab", &op, PHASE_TIMEOUT).await;

    assert_eq!(
        keys_under(&store, &a_dir).await,
        Vec::<String>::new(),
        "retention: Delete leaves nothing under the run's prefix"
    );
    assert_eq!(
        keys_under(&store, &ab_dir).await,
        ab_keys,
        "the default retention (Retain) keeps every object"
    );
    let deleted = wait_event(
        &client,
        &ns.name,
        Some("a"),
        "ArchivesDeleted",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(deleted.type_.as_deref(), Some("Normal"));
    assert!(
        deleted
            .note
            .as_deref()
            .is_some_and(|n| n.contains("deleted 2 stored objects")),
        "{deleted:?}"
    );

    for key in ab_keys {
        let _ = store.delete(&key.as_str().into()).await;
    }
}

#[tokio::test]
async fn a_running_run_with_retention_delete_is_drained_then_its_files_deleted_on_deletion() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "retrun").await;
    let dir = host_dir("store-retrun");
    let store_url = format!("file://{}", dir.display());
    let op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"drained, then deleted\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    wait_fields_served(&runs, &out).await;
    // A long-lived sandbox (no command): deleting it is what tears it down.
    let mut s = spec(&[&out]).retention(Some(Retention::Delete)).build();
    s.command = None;
    create(&runs, "live", s).await;
    let run = wait_phase(&runs, "live", Phase::Running, &op).await;
    crypto();
    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let run_dir = run_dir(&prefix, &run_ref(&ns.name, &run));
    assert_eq!(
        keys_under(&store, &run_dir).await.len(),
        0,
        "nothing stored yet"
    );

    runs.delete("live", &DeleteParams::default()).await.unwrap();
    wait_gone(&runs, "live", &op, PHASE_TIMEOUT).await;
    // The drain stored archive + manifest (the Event announcing the end says so), then the
    // finalizer deleted both before letting go.
    let drained = wait_event(
        &client,
        &ns.name,
        Some("live"),
        "Stopped",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert!(
        drained
            .note
            .as_deref()
            .is_some_and(|n| n.contains("1 Drained")),
        "{drained:?}"
    );
    let deleted = wait_event(
        &client,
        &ns.name,
        Some("live"),
        "ArchivesDeleted",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert!(
        deleted
            .note
            .as_deref()
            .is_some_and(|n| n.contains("deleted 2 stored objects")),
        "{deleted:?}"
    );
    assert_eq!(keys_under(&store, &run_dir).await, Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_store_that_refuses_deletes_warns_and_still_releases_the_run_after_the_drain_timeout() {
    let s3 = s3();
    let options = s3.options();
    let store_url = s3_url(&s3);
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "refuse").await;
    // Retention comes from the operator-wide default here (the run does not set it).
    let mut op = Operator::builder(&ns.name, &store_url)
        .store_options(&options)
        .flags(&["--default-retention", "Delete"])
        .start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"stays behind\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_fields_served(&runs, &out).await;
    let run = run_to_success(
        &runs,
        &pods,
        "refused",
        spec(&[&out]).drain_timeout("8s"),
        &op,
    )
    .await;
    crypto();
    let (store, prefix) = store_from_url(&store_url, &options).unwrap();
    let dir = run_dir(&prefix, &run_ref(&ns.name, &run));
    let stored = keys_under(&store, &dir).await;
    assert_eq!(stored.len(), 2, "archive + manifest");

    // The same operator, now with credentials the store refuses.
    op.kill();
    let op = Operator::builder(&ns.name, &store_url)
        .store_options(&s3.options_with_secret("not-the-secret"))
        .flags(&["--default-retention", "Delete"])
        .start();
    runs.delete("refused", &DeleteParams::default())
        .await
        .unwrap();
    let failed = wait_event(
        &client,
        &ns.name,
        Some("refused"),
        "ArchiveDeleteFailed",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    // Bounded by the drain timeout (8s): the run is released, with the files left in place.
    wait_gone(&runs, "refused", &op, PHASE_TIMEOUT).await;
    let abandoned = wait_event(
        &client,
        &ns.name,
        Some("refused"),
        "ArchiveDeleteAbandoned",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(abandoned.type_.as_deref(), Some("Warning"));
    assert_eq!(
        keys_under(&store, &dir).await,
        stored,
        "nothing was deleted"
    );
    for key in stored {
        let _ = store.delete(&key.as_str().into()).await;
    }
}

#[tokio::test]
async fn the_apiserver_refuses_a_negative_or_absurd_ttl_with_a_hint_and_accepts_null() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "ttlbad").await;
    let out = host_dir("out");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    wait_fields_served(&runs, &out).await;
    for bad in [-1, 31_536_001, i64::MAX] {
        let mut s = spec(&[&out]).build();
        s.ttl_seconds_after_finished = Some(bad);
        let err = runs
            .create(&PostParams::default(), &SandboxRun::new("bad", s))
            .await
            .expect_err("a ttlSecondsAfterFinished out of 0..=31536000 is refused");
        let text = err.to_string();
        assert!(
            text.contains("ttlSecondsAfterFinished") && text.contains("leave it unset"),
            "{bad}: {text}"
        );
    }
    // An explicit null is "unset" (the field is nullable), not a value the rule judges.
    let api_resource = kube::discovery::ApiResource::erase::<SandboxRun>(&());
    let dynamic: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource);
    let mut value = serde_json::to_value(SandboxRun::new("null-ttl", spec(&[&out]).build()))
        .expect("serialize");
    value["spec"]["ttlSecondsAfterFinished"] = serde_json::Value::Null;
    let object: kube::api::DynamicObject = serde_json::from_value(value).expect("dynamic object");
    dynamic
        .create(&PostParams::default(), &object)
        .await
        .expect("ttlSecondsAfterFinished: null is accepted");
    // No operator watches this namespace: nothing holds the run, the namespace can go.
}
