//! Every sample of `config/samples/` run on the bed to its documented end.

use super::*;

/// Issue #27: every sample in config/samples runs on the bed to the end its header documents,
/// applied as a user would (`kubectl apply -f`, the bed registry's address for `localhost:15000`).
/// - batch-run.yaml: Complete (`Succeeded`), `/work/out` drained with its report;
/// - long-lived-sandbox.yaml (with its ConfigMap): Running until `stop`, a file written through
///   `kubectl exec` drained, the untouched path `Empty`, phase `Stopped`;
/// - real-node-run.yaml (`make demo`'s): Complete;
/// - retries.yaml: Complete on its third attempt, the first attempt's files readable;
/// - kueue.yaml (the operator with `--kueue`, Kueue on the bed): admitted (`Queued=False
///   Admitted`), Complete, its Workload Finished.
#[tokio::test]
async fn every_sample_runs_on_the_bed_to_its_documented_end() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "real-samples").await;
    let (_dir, store_url) = file_store("real-samples");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &["--egress-gate-probe", &probe, "--kueue"],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    let samples = repo().join("config/samples");
    let listed =
        std::fs::read_to_string(samples.join("kustomization.yaml")).expect("kustomization");
    for file in ["batch-run.yaml", "long-lived-sandbox.yaml"] {
        assert!(
            listed.contains(file),
            "{file} is in config/samples' kustomization"
        );
    }
    for file in [
        "batch-run.yaml",
        "long-lived-sandbox.yaml",
        "real-node-run.yaml",
        "retries.yaml",
        "kueue.yaml",
    ] {
        let text = std::fs::read_to_string(samples.join(file)).expect("sample");
        let text = text.replace("localhost:15000/", &format!("{registry}/"));
        let mut apply = tool("kubectl");
        apply.args(["apply", "-n", &ns.name, "-f", "-"]);
        let out = run(apply, Some(text.as_bytes()));
        assert!(out.status.success(), "kubectl apply {file}: {out:?}");
    }

    for name in ["batch-report", "demo-report"] {
        let done = wait_run(&runs, name, "a final phase", &op, final_phase).await;
        let status = done.status.clone().expect("status");
        assert_eq!(status.phase, Some(Phase::Succeeded), "{name}: {status:?}");
        assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained, "{name}");
    }
    let dest = files_get(&ns.name, "batch-report", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let report = std::fs::read_to_string(extracted(&dest, 0).join("report.md")).expect("report");
    assert!(report.contains("samples: 1000"), "{report}");
    // kueue.yaml: admitted, Complete, its Workload Finished.
    let queued = wait_run(&runs, "queued-report", "a final phase", &op, final_phase).await;
    let status = queued.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Queued" && c.status == "False" && c.reason == "Admitted"),
        "{status:?}"
    );
    workload_finished(&client, &ns.name, "queued-report-sbr").await;
    // retries.yaml: two failed attempts, then Complete, each attempt's report kept.
    let flaky = wait_run(&runs, "flaky-job", "a final phase", &op, final_phase).await;
    let status = flaky.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 2, "{status:?}");
    let first = files_get_attempt(&ns.name, "flaky-job", &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(first.join("report.txt")).expect("report.txt"),
        "attempt 1\n"
    );

    let sandbox = wait_run(
        &runs,
        "dev-sandbox",
        "Running",
        &op,
        phase_is(Phase::Running),
    )
    .await;
    let pod = pod_of(&sandbox);
    let exec = exec_in_workload(
        &ns.name,
        &pod,
        "cat /etc/devbox/settings.toml > /home/dev/artifacts/out.txt",
    );
    assert!(exec.status.success(), "{exec:?}");
    runs.patch(
        "dev-sandbox",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"stop": true}})),
    )
    .await
    .expect("stop");
    let stopped = wait_run(&runs, "dev-sandbox", "Stopped", &op, final_phase).await;
    let status = stopped.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Stopped), "{status:?}");
    let phases: Vec<ReadBackPhase> = status.read_back.iter().map(|p| p.phase).collect();
    assert_eq!(phases, [ReadBackPhase::Drained, ReadBackPhase::Empty]);
    let dest = files_get(&ns.name, "dev-sandbox", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "editor = \"vi\"\n");
}
