//! The operator installed by Helm on the real node: in-cluster with its webhook, election and
//! metrics; `helm test` passing, then failing when the run cannot drain.

use super::*;

/// The operator as users install it: `helm install` of charts/ with the image built without
/// Docker, two replicas (active-active, sharing the shard Leases), the S3 store, the webhook behind the chart's Service.
/// It runs in the cluster with only the chart's ServiceAccount and RBAC; the apiserver reaches
/// its webhook through the Service (denial of a bad run, a warning for a tag, via `kubectl
/// apply`); a run on the real node is drained into S3; `/metrics` answers through its Service.
#[tokio::test]
async fn the_operator_installed_by_helm_runs_in_cluster_with_webhook_election_and_metrics() {
    let client = client().await;
    ensure_crd(&client).await;
    let release_ns = TestNamespace::new(&client, "helm").await;
    let runs_ns = restricted_namespace(&client, "helm-runs").await;
    let s3 = s3();
    let fullname = format!("sbr-{:08x}", rand_u32());
    let store_url = format!("s3://{}/helm-{fullname}", s3.bucket);
    let _release = install_operator_by_helm(
        &release_ns.name,
        &fullname,
        &store_url,
        json!({
            "replicas": 2,
            "watchNamespaces": [runs_ns.name],
            // Only this test's namespace goes through this release's webhook.
            "webhook": {"namespaceSelector": {"matchLabels": {"sandboxrun-test": runs_ns.name}}},
            // `helm test`: its tiny run in the watched namespace, on the real node.
            "test": {
                "image": pod_image("busybox"),
                "timeout": "3m",
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "tolerations": [real_node_toleration()],
            },
        }),
    );
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), &release_ns.name);
    // The operator's own pods (the chart's egress proxy runs beside them).
    let pod_names: Vec<String> = operator_pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("list operator pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(pod_names.len(), 2, "two replicas: {pod_names:?}");
    let logs = || {
        pod_names
            .iter()
            .map(|p| {
                Command::new(kubectl_path())
                    .args(["logs", "-n", &release_ns.name, p, "--tail", "40"])
                    .output()
                    .map(|o| format!("--- {p}\n{}", String::from_utf8_lossy(&o.stdout)))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Two replicas run active-active by default (issue #28): each holds some of the shard Leases
    // (`<lease-name>-shard-<k>`, the lease name being the release's fullname).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &release_ns.name);
    let holders = eventually(
        "both replicas to hold shards",
        Duration::from_secs(90),
        || {
            let leases = leases.clone();
            let prefix = format!("{fullname}-shard-");
            let pod_names = pod_names.clone();
            async move {
                let listed = leases.list(&ListParams::default()).await.ok()?.items;
                let holders: std::collections::BTreeSet<String> = listed
                    .iter()
                    .filter(|l| l.name_any().starts_with(&prefix))
                    .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
                    .filter(|h| !h.is_empty())
                    .collect();
                (pod_names.iter().all(|p| holders.contains(p))).then_some(holders)
            }
        },
    )
    .await;
    assert!(
        holders.iter().all(|h| pod_names.contains(h)),
        "the shard holders {holders:?} are the replicas {pod_names:?}"
    );

    // The webhook, reached by the apiserver through the chart's Service: a run breaking the
    // ADR-006 rules is denied with its hints (retried while the caBundle is being published).
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    let bad = format!(
        "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: bad}}\n\
         spec: {{image: {registry}/busybox:1.35, user: \"1000\", hostState: auto, \
         readBack: {{paths: [{{path: /work/out}}]}}}}\n"
    );
    let denial = eventually("the webhook to answer", Duration::from_secs(90), || {
        let out = kubectl_apply(&runs_ns.name, &bad);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let answered = !out.status.success() && stderr.contains("denied the request");
        async move { answered.then_some(stderr) }
    })
    .await;
    assert!(
        denial.contains("hostState"),
        "the denial names the rule: {denial}"
    );

    // A tag instead of a digest is admitted with a warning, and the run drains into S3.
    let good = format!(
        "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: good}}\n\
         spec:\n  image: {registry}/busybox:1.35\n  user: \"1000:1000\"\n  command: [sh, -c, \
         'echo from-helm > $ITERION_ARTIFACT_FILES_DIR/report.txt']\n  nodeSelector: \
         {{{REAL_NODE_LABEL}: \"true\"}}\n  tolerations: [{{key: {REAL_NODE_LABEL}, operator: \
         Equal, value: \"true\", effect: NoSchedule}}]\n  readBack: {{paths: [{{path: \
         /work/out}}], drainTimeout: 2m}}\n"
    );
    let admitted = kubectl_apply(&runs_ns.name, &good);
    let stderr = String::from_utf8_lossy(&admitted.stderr).to_string();
    assert!(admitted.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning:"),
        "a tag draws a warning: {stderr}"
    );

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let start = Instant::now();
    let run = loop {
        let r = runs.get("good").await.expect("get run");
        if final_phase(&r) {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "run did not finish: {:?}\n{}",
            r.status,
            logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let status = run.status.expect("status");
    assert_eq!(
        status.phase,
        Some(Phase::Succeeded),
        "{status:?}\n{}",
        logs()
    );
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let host_store_env = s3.host_env();
    let dest = files_get(&runs_ns.name, "good", &store_url, &[], &host_store_env)
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_eq!(
        std::fs::read_to_string(extracted(&dest, 0).join("report.txt")).expect("report.txt"),
        "from-helm\n"
    );

    // /metrics through the chart's metrics Service (its ClusterIP, via kube-proxy): the leader
    // counted the drain. Each replica has its own registry, so scrape until the leader answers.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &release_ns.name);
    let svc = services
        .get(&format!("{fullname}-metrics"))
        .await
        .expect("metrics Service");
    let ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("metrics Service ClusterIP");
    let url = format!("http://{ip}:8080/metrics");
    let text = eventually(
        "the leader's metrics through the Service",
        Duration::from_secs(60),
        || {
            let url = url.clone();
            async move {
                let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
                text.contains("sandboxrun_drains_total{phase=\"Drained\"} 1")
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(text.contains("sandboxrun_"), "{text}");

    let chart = repo().join("charts/sandboxrun-operator");
    helm_test_passes_then_fails_when_the_run_cannot_drain(
        &client,
        &fullname,
        &release_ns.name,
        &runs_ns.name,
        &chart,
    )
    .await;
}

/// Issue #14 item 5: `helm test` of the release above. Its pod (the operator image, `selftest`)
/// creates a tiny run on the real node, which drains into S3, and deletes it: the test passes and
/// leaves no run behind. Then, with a workload that leaves only a file the holder cannot read
/// (`test.script`), the path ends `Failed`: `helm test` fails and the pod's log says why.
async fn helm_test_passes_then_fails_when_the_run_cannot_drain(
    client: &Client,
    release: &str,
    release_ns: &str,
    runs_ns: &str,
    chart: &Path,
) {
    let test_pod = format!("{release}-selftest");
    let pod_log = || {
        Command::new(kubectl_path())
            .args(["logs", "-n", release_ns, &test_pod])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    let tested = run_helm(&["test", release, "-n", release_ns, "--timeout", "5m"]);
    let stdout = String::from_utf8_lossy(&tested.stdout).to_string();
    assert!(
        tested.status.success(),
        "helm test failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&tested.stderr),
        pod_log()
    );
    // Helm lists each test hook with its phase; the pod is among them.
    let phases: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Phase:"))
        .map(str::trim)
        .collect();
    assert!(
        stdout.contains(&test_pod)
            && !phases.is_empty()
            && phases.iter().all(|p| *p == "Succeeded"),
        "{stdout}"
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), runs_ns);
    let left = runs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=helm-test"))
        .await
        .expect("list runs");
    assert!(
        left.items.is_empty(),
        "the selftest deleted its run: {left:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), release_ns);
    assert!(
        pods.get_opt(&test_pod).await.expect("get pod").is_none(),
        "a passing test pod is deleted (hook-succeeded)"
    );

    let unreadable = r#"echo locked > "$ITERION_ARTIFACT_FILES_DIR/locked.txt"; chmod 0000 "$ITERION_ARTIFACT_FILES_DIR/locked.txt""#;
    let upgraded = run_helm(&[
        "upgrade",
        release,
        &chart.display().to_string(),
        "-n",
        release_ns,
        "--reuse-values",
        "--set-string",
        &format!("test.script={unreadable}"),
        "--wait",
        "--timeout",
        "4m",
    ]);
    assert!(
        upgraded.status.success(),
        "helm upgrade: {}",
        String::from_utf8_lossy(&upgraded.stderr)
    );
    let tested = run_helm(&["test", release, "-n", release_ns, "--timeout", "5m"]);
    assert!(
        !tested.status.success(),
        "helm test passed with an undrainable run: {}",
        String::from_utf8_lossy(&tested.stdout)
    );
    let log = pod_log();
    assert!(
        log.contains("selftest: FAIL")
            && log.contains("path /work/out ended Failed, not Drained")
            && log.contains("locked.txt"),
        "the failed test pod says why: {log}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let left = runs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=helm-test"))
        .await
        .expect("list runs");
    assert!(
        left.items.is_empty(),
        "a failed selftest deletes its run too: {left:?}"
    );
}
