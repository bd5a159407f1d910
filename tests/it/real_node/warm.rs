//! Warm pools on the real node: a run served from a ready pod and a template change rolled out,
//! a filtered template's pool, a queued run taking a pool pod once admitted, each attempt of a
//! retried run taking one.

use super::*;

/// Issue #39 on the real node (docs/user-guide.md "Sandboxes for agents: warm pools"), the
/// operator with `--warm-pools`:
/// - a SandboxRunPool of two replicas of a template gets two ready pods, their workload parked in
///   the operator's launcher;
/// - a run made from the template that sets only command and env takes one of them
///   (`status.warmStart.pod`): the launcher starts the run's command with the run's env as the
///   template's user, its file is drained, it Succeeds; the pod was claimed (owned by the run)
///   and the pool makes another;
/// - a run that sets a field that changes the pod (`resources`) starts cold and says why;
/// - the template changed the pod (its resources): the pool replaces its unclaimed pods with the
///   new version's.
#[tokio::test]
async fn a_warm_pool_serves_a_run_from_a_ready_pod_and_rolls_out_a_template_change() {
    use sandboxrun_operator::api::{EnvVar, OpenField, SandboxRunTemplate, TemplateRef};
    let RealBed {
        client,
        ns,
        store_url,
        op,
        ..
    } = RealBed::with_flags("pool", &["--warm-pools"]).await;
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let mut locked = real_spec(Some("exit 9"), &["/work/out"]);
    locked.env = vec![EnvVar {
        name: "VERSION".into(),
        value: "1".into(),
        value_from: None,
    }];
    let pools = make_template_and_pool(
        &client,
        &ns.name,
        ("agent", "agents"),
        template_of(
            locked,
            &[OpenField::Command, OpenField::Env, OpenField::Resources],
        ),
        2,
    )
    .await;
    let ready = |n: i32| wait_pool_ready(&pools, "agents", n, POOL_READY);
    let first = ready(2).await;
    let before = pool_pods(&client, &ns.name, "agents").await;
    assert_eq!(before.len(), 2, "{before:?}");

    // A run that sets only command and env: warm.
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let warm_spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            r#"echo "task=$TASK version=$VERSION uid=$(id -u)" > "$ITERION_ARTIFACT_FILES_DIR/out.txt""#.into(),
        ]),
        env: vec![EnvVar {
            name: "TASK".into(),
            value: "42".into(),
            value_from: None,
        }],
        ..Default::default()
    };
    create(&runs, "warm", warm_spec.clone()).await;
    let done = wait_run(&runs, "warm", "the warm run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let warm = status.warm_start.clone().expect("warmStart");
    let took = warm
        .pod
        .clone()
        .unwrap_or_else(|| panic!("a pool pod was taken: {warm:?}"));
    assert!(
        before.iter().any(|(name, _, _)| *name == took),
        "{took} is one of the pool's ready pods {before:?}"
    );
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let dest = files_get(&ns.name, "warm", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(
        out, "task=42 version=1 uid=1000\n",
        "the run's command and env, the template's user"
    );
    // The pool makes another: two unclaimed ready pods again, the taken one not among them.
    ready(2).await;
    let after = pool_pods(&client, &ns.name, "agents").await;
    assert!(
        after
            .iter()
            .filter(|(_, _, claimed)| !claimed)
            .all(|(name, _, _)| *name != took),
        "{after:?}"
    );

    // A run that sets a field that changes the pod starts cold and says why.
    let mut cold_spec = warm_spec.clone();
    cold_spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("20m".into()),
        )])),
        ..Default::default()
    });
    create(&runs, "cold", cold_spec).await;
    let done = wait_run(&runs, "cold", "the cold run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let cold = status.warm_start.clone().expect("warmStart");
    assert!(cold.pod.is_none(), "{cold:?}");
    assert!(
        cold.cold_reason
            .as_deref()
            .unwrap_or_default()
            .contains("resources"),
        "{cold:?}"
    );
    assert_eq!(status.pod_name.as_deref(), Some("cold-sbr"), "{status:?}");
    // The pool counts it: `status.misses` (the claims write it; the pool's own updates keep it).
    eventually(
        "the pool to count the miss",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            async move { (pools.get("agents").await.ok()?.status?.misses == Some(1)).then_some(()) }
        },
    )
    .await;

    // The template changes the pod (its resources): the unclaimed pods are replaced by the new
    // version's. (An env value is not the pod's shape: the launcher delivers it at claim time.)
    let bump = json!({"spec": {"template": {"resources": {"requests": {"cpu": "15m"}}}}});
    templates
        .patch("agent", &PatchParams::default(), &Patch::Merge(&bump))
        .await
        .expect("change the template");
    let old_hash = first.template_hash.clone().expect("hash");
    eventually("the pool to roll out", Duration::from_secs(180), || {
        let (client, ns, old_hash) = (client.clone(), ns.name.clone(), old_hash.clone());
        async move {
            let pods = pool_pods(&client, &ns, "agents").await;
            let unclaimed: Vec<_> = pods.iter().filter(|(_, _, c)| !c).collect();
            (unclaimed.len() == 2 && unclaimed.iter().all(|(_, h, _)| *h != old_hash)).then_some(())
        }
    })
    .await;
    // The pool's status says so once its next reconcile has written it (it may still show the
    // old version's two ready pods a moment after they were replaced).
    eventually(
        "the pool's status to show the new version ready",
        Duration::from_secs(180),
        || {
            let (pools, old_hash) = (pools.clone(), old_hash.clone());
            async move {
                let s = pools.get("agents").await.ok()?.status?;
                let new = s.template_hash.as_ref().is_some_and(|h| *h != old_hash);
                (new && s.ready_replicas == 2 && s.replicas == 2).then_some(())
            }
        },
    )
    .await;

    // Issue #55: the pool deleted, the garbage collector deletes its unclaimed pods with their
    // own grace period (330 s), which their holders' preStop would wait out for a drain that
    // never comes; the operator deletes them again with 1 s. On the old code they stayed
    // Terminating past this wait.
    let unclaimed = unclaimed_pool_pods(&client, &ns.name, "agents").await;
    assert_eq!(unclaimed.len(), 2, "{unclaimed:?}");
    pools
        .delete("agents", &kube::api::DeleteParams::background())
        .await
        .expect("delete the pool");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    eventually(
        "the deleted pool's unclaimed pods to be gone",
        Duration::from_secs(90),
        || {
            let (pods, unclaimed) = (pods.clone(), unclaimed.clone());
            async move {
                for name in &unclaimed {
                    if pods.get_opt(name).await.ok()?.is_some() {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
}

/// Issue #39 (templates whose runs restrict egress are pooled) on the real node, the operator
/// with `--warm-pools`, the egress gate probing the node's kubelet port, and
/// `--egress-denylist-wide` (a denylist allows every address it does not deny, the node's among
/// them, unless its policy denies the node):
/// - a pool of an allowlist template (`192.0.2.0/24`) and one of a denylist template of the same
///   range get ready pods; each pool pod has its own NetworkPolicy (`<pod>-egress`, selecting it,
///   owned by it) and its gate exited 0 before its workload was parked;
/// - a run made from each takes its pool's pod and its FIRST instruction, a connection to a
///   listener on the node's address, fails: the listener never sees them. For the denylist run
///   this needs the run's own policy to deny the node too: the pool pod's policy keeps selecting
///   the pod and policies add up (a run policy without the node denied would open the node);
/// - control: a run with open egress reaches the listener at once.
#[tokio::test]
async fn a_warm_pool_of_a_filtered_template_keeps_its_pods_and_their_runs_filtered() {
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    use sandboxrun_operator::api::{OpenField, SandboxRunPool, TemplateRef};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool-gate").await;
    let (_dir, store_url) = file_store("pool-gate");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &[
            "--warm-pools",
            "--egress-gate-probe",
            &probe,
            "--egress-denylist-wide",
        ],
    );
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let kinds = [("allow", Allowlist), ("deny", Denylist)];
    for (name, mode) in kinds {
        let mut spec = real_spec(Some("exit 9"), &[]);
        spec.env = vec![env_var("DENIED", &denied)];
        spec.network = Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec!["192.0.2.0/24".to_string()],
        });
        make_template_and_pool(
            &client,
            &ns.name,
            (name, name),
            template_of(spec, &[OpenField::Command]),
            1,
        )
        .await;
    }
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (name, _) in kinds {
        wait_pool_ready(&pools, name, 1, POOL_READY).await;
        let listed = pool_pods(&client, &ns.name, name).await;
        let pod_name = listed.first().map(|p| p.0.clone()).expect("a pool pod");
        let policy = policies
            .get(&format!("{pod_name}-egress"))
            .await
            .unwrap_or_else(|e| panic!("{name}: the pool pod's NetworkPolicy: {e}"));
        let owner = policy.owner_references().first().cloned().expect("owner");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Pod", pod_name.as_str())
        );
        let gate = pods
            .get(&pod_name)
            .await
            .expect("the pool pod")
            .status
            .and_then(|s| s.init_container_statuses)
            .and_then(|cs| cs.into_iter().find(|c| c.name == "egress-gate"))
            .and_then(|c| c.state?.terminated)
            .unwrap_or_else(|| panic!("{name}: the pool pod's gate ended"));
        assert_eq!(gate.exit_code, 0, "{name}: {gate:?}");
    }

    // Control: open egress reaches the listener in its first instruction.
    let mut open = real_spec(Some(FIRST_INSTRUCTION_PROBE), &[]);
    open.env = vec![env_var("DENIED", &denied)];
    create(&runs, "open", open).await;
    let first_line = |run: &SandboxRun| probe_lines(run).get("first").cloned().unwrap_or_default();
    let done = wait_run(&runs, "open", "the open run to end", &op, final_phase).await;
    assert!(
        first_line(&done).starts_with("ok denied from"),
        "{:?}",
        done.status
    );
    for (name, _) in kinds {
        let spec = SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced(name)),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                FIRST_INSTRUCTION_PROBE.into(),
            ]),
            ..Default::default()
        };
        let run = format!("{name}-run");
        create(&runs, &run, spec).await;
        let done = wait_run(
            &runs,
            &run,
            "the warm filtered run to end",
            &op,
            final_phase,
        )
        .await;
        let status = done.status.clone().expect("status");
        let warm = status.warm_start.clone().expect("warmStart");
        assert!(warm.pod.is_some(), "{name}: a pool pod was taken: {warm:?}");
        let line = first_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the warm run's first instruction was filtered: {line:?} {status:?}"
        );
        let seen = denied_peers.lock().expect("peers").clone();
        assert_eq!(
            seen.len(),
            1,
            "{name}: only the open run reached the node's listener: {seen:?}"
        );
    }
}

/// Issue #39 with Kueue on the real node (the operator's `--warm-pools --kueue`): a run made from
/// a pooled template and labelled with a LocalQueue gets its Workload and no pod until Kueue
/// admits it, then takes the pool's ready pod — its cold pod with the admitted flavor's node
/// labels has the pool's shape (the template already places its pods on that node) — and ends
/// Succeeded with its file, its Workload Finished.
#[tokio::test]
async fn a_queued_run_takes_a_warm_pool_pod_once_kueue_admits_it() {
    use sandboxrun_operator::api::{OpenField, TemplateRef};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool-kueue").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("pool-kueue");
    let op = start_operator_with(&ns.name, &store_url, &["--warm-pools", "--kueue"]);
    let mut spec = real_spec(Some("exit 9"), &["/work/out"]);
    // The flavor's node label (kueue_queue's): Kueue's placement changes nothing of this pod.
    spec.node_selector
        .get_or_insert_with(BTreeMap::new)
        .insert("kubernetes.io/hostname".into(), "real-node-0".into());
    real_pool(
        &client,
        &ns.name,
        ("queued-agent", "queued-agents"),
        (spec, &[OpenField::Command]),
        1,
    )
    .await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut run = SandboxRun::new(
        "queued",
        SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced("queued-agent")),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                r#"echo queued-warm > "$ITERION_ARTIFACT_FILES_DIR/out.txt""#.into(),
            ]),
            ..Default::default()
        },
    );
    run.metadata.labels = Some(BTreeMap::from([(
        "kueue.x-k8s.io/queue-name".to_string(),
        "lq".to_string(),
    )]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the queued run");
    let done = wait_run(&runs, "queued", "the queued run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Queued" && c.status == "False" && c.reason == "Admitted"),
        "admitted by Kueue: {status:?}"
    );
    let warm = status.warm_start.clone().expect("warmStart");
    assert!(warm.pod.is_some(), "a pool pod was taken: {warm:?}");
    let dest = files_get(&ns.name, "queued", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "queued-warm\n");
    workload_finished(&client, &ns.name, "queued-sbr").await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #39 with `spec.retryPolicy` on the real node (`--warm-pools`): each attempt of a run made
/// from a pooled template asks the pool. The template's workload fails its first attempt (exit
/// 3) and succeeds its second; with a pool of two ready pods, both attempts take a pool pod — two
/// different ones (a pool pod serves one start) — the first attempt's pod is recorded in
/// `status.attempts[0]`, `status.warmStart` names the second's, and the second attempt's file is
/// drained. Before, a retry always started cold.
#[tokio::test]
async fn each_attempt_of_a_retried_run_takes_a_warm_pool_pod() {
    use sandboxrun_operator::api::{OpenField, RetryBackoff, RetryPolicy, TemplateRef};
    let RealBed {
        client,
        ns,
        store_url,
        op,
        ..
    } = RealBed::with_flags("pool-retry", &["--warm-pools"]).await;
    let mut spec = real_spec(Some("exit 9"), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 2,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(1),
            cap_seconds: Some(1),
        }),
        rules: Vec::new(),
    });
    real_pool(
        &client,
        &ns.name,
        ("retried", "retried"),
        (spec, &[OpenField::Command]),
        2,
    )
    .await;
    let pool_pod_names: Vec<String> = pool_pods(&client, &ns.name, "retried")
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/out.txt"; [ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exit 3"#;
    let spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("retried")),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    };
    create(&runs, "flaky", spec).await;
    let done = wait_run(&runs, "flaky", "the retried run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 1, "{status:?}");
    let first = status.attempts[0].pod_name.clone();
    let warm = status.warm_start.clone().expect("warmStart");
    assert_eq!(warm.attempt, Some(2), "{warm:?}");
    let second = warm.pod.clone().unwrap_or_default();
    // Pool pods of this template version are `<pool>-<hash>-<suffix>`: the first attempt took one
    // of the pods listed above; the pool makes another when a pod is claimed, and the second
    // attempt may take that one (a cold pod would be `flaky-sbr-2`).
    let version = pool_pod_names
        .first()
        .and_then(|n| n.rsplit_once('-'))
        .map(|(head, _)| format!("{head}-"))
        .expect("a pool pod name");
    assert!(
        pool_pod_names.contains(&first) && second.starts_with(&version) && first != second,
        "both attempts took a pool pod ({pool_pod_names:?} listed before the run): {first} then {second}"
    );
    let dest = files_get(&ns.name, "flaky", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "attempt 2\n");
}

/// Issue #54 item 2 on the real node (docs/user-guide.md "Sandboxes for agents: warm pools"):
/// a run whose env takes a value from a key of a Secret of its namespace is served warm — the
/// operator reads the Secret at claim time and the launcher delivers the value — and its workload
/// sees the value (it writes its sha256, never the value, to its drained file). A run whose
/// Secret does not exist starts cold and its coldReason names the Secret, not a value. (On the
/// old code both started cold: "takes its value from a Secret or ConfigMap".)
#[tokio::test]
async fn a_run_whose_env_takes_a_secrets_value_is_served_warm_and_sees_it() {
    use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
    use sandboxrun_operator::api::{EnvVar, EnvVarSource, OpenField, TemplateRef};
    use sha2::Digest;
    let RealBed {
        client,
        ns,
        store_url,
        op,
        ..
    } = RealBed::with_flags("pool-secret", &["--warm-pools"]).await;
    let value = "s3cr3t-for-the-warm-run";
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds"},
        "stringData": {"token": value},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &secret)
        .await
        .expect("create the Secret");
    let pools = real_pool(
        &client,
        &ns.name,
        ("agent", "agents"),
        (
            real_spec(Some("exit 9"), &["/work/out"]),
            &[OpenField::Command, OpenField::Env],
        ),
        1,
    )
    .await;
    let ready = pool_pods(&client, &ns.name, "agents").await;
    let from = |name: &str| EnvVar {
        name: "TOKEN".into(),
        value: String::new(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: name.into(),
                key: "token".into(),
                optional: None,
            }),
            config_map_key_ref: None,
        }),
    };
    let script =
        r#"printf %s "$TOKEN" | sha256sum | cut -d' ' -f1 > "$ITERION_ARTIFACT_FILES_DIR/sha.txt""#;
    let spec = |secret: &str| SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        env: vec![from(secret)],
        ..Default::default()
    };
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "warm", spec("creds")).await;
    let done = wait_run(&runs, "warm", "the warm run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let warm = status.warm_start.clone().expect("warmStart");
    let took = warm
        .pod
        .clone()
        .unwrap_or_else(|| panic!("a pool pod was taken: {warm:?}"));
    assert!(ready.iter().any(|(n, _, _)| *n == took), "{took} {ready:?}");
    let dest = files_get(&ns.name, "warm", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let sha = std::fs::read_to_string(extracted(&dest, 0).join("sha.txt")).expect("sha.txt");
    assert_eq!(
        sha.trim(),
        hex::encode(sha2::Sha256::digest(value.as_bytes())),
        "the workload saw the Secret's value"
    );
    // Nothing the operator wrote about the run carries the value.
    let written = serde_json::to_string(&done).expect("the run as JSON");
    assert!(!written.contains(value), "{written}");

    // A Secret that does not exist, with a ready pod there: cold, named (its cold pod waits on
    // the kubelet as without a pool).
    eventually(
        "the pool to make another pod",
        Duration::from_secs(180),
        || {
            let (client, ns, took) = (client.clone(), ns.name.clone(), took.clone());
            let pools = pools.clone();
            async move {
                let pods = pool_pods(&client, &ns, "agents").await;
                let fresh = pods.iter().any(|(n, _, claimed)| !claimed && *n != took);
                let s = pools.get("agents").await.ok()?.status?;
                (fresh && s.ready_replicas == 1).then_some(())
            }
        },
    )
    .await;
    create(&runs, "missing", spec("nowhere")).await;
    let started = |r: &SandboxRun| r.status.as_ref().is_some_and(|s| s.warm_start.is_some());
    let cold = wait_run(&runs, "missing", "the run to start cold", &op, started).await;
    let reason = cold
        .status
        .and_then(|s| s.warm_start)
        .and_then(|w| w.cold_reason)
        .unwrap_or_default();
    assert!(reason.contains("nowhere"), "{reason}");
}

/// The APIService of the operator's external metrics (cluster-wide: one per cluster), deleted
/// when the test ends, before its operator stops (declared after it): an APIService that cannot
/// be reached makes discovery fail for every client of the bed, and keeps namespaces from being
/// deleted.
struct MetricsApiService;

const METRICS_API_SERVICE: &str = "v1beta1.external.metrics.k8s.io";

impl MetricsApiService {
    /// Points the external metrics API at `service` in `ns` (its caBundle is the operator's to
    /// patch, `--external-metrics-api-service`).
    async fn create(client: &Client, ns: &str, service: &str) -> MetricsApiService {
        use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
        let services: Api<APIService> = Api::all(client.clone());
        let _ = services
            .delete(METRICS_API_SERVICE, &Default::default())
            .await;
        let made: APIService = serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": METRICS_API_SERVICE},
            "spec": {
                "group": "external.metrics.k8s.io", "version": "v1beta1",
                "groupPriorityMinimum": 100, "versionPriority": 100,
                "service": {"namespace": ns, "name": service, "port": 443},
            }
        }))
        .expect("an APIService");
        eventually("the APIService created", Duration::from_secs(30), || {
            let (services, made) = (services.clone(), made.clone());
            async move { services.create(&Default::default(), &made).await.ok() }
        })
        .await;
        MetricsApiService
    }
}

impl Drop for MetricsApiService {
    fn drop(&mut self) {
        clean_up_from_drop(|client| async move {
            use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
            let _ = Api::<APIService>::all(client)
                .delete(METRICS_API_SERVICE, &Default::default())
                .await;
        });
    }
}

/// A Service without a selector whose one endpoint is `ip:port` (the operator runs on this
/// host, on the real node's bridge address: the apiserver routes an aggregated request to the
/// endpoint, `--enable-aggregator-routing`).
async fn service_to_host(client: &Client, ns: &str, name: &str, ip: &str, port: u16) {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"port": 443, "targetPort": port}]}
    }))
    .expect("a Service");
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": name},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": port}]}]
    }))
    .expect("Endpoints");
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&Default::default(), &service)
        .await
        .expect("create the Service");
    Api::<Endpoints>::namespaced(client.clone(), ns)
        .create(&Default::default(), &endpoints)
        .await
        .expect("create the Endpoints");
}

/// `sandboxrun_pool_claimed` of `selector` in `ns`, read through the apiserver (the aggregation
/// layer): each item's pool and value.
async fn claimed_metric(
    client: &Client,
    ns: &str,
    selector: &str,
) -> Option<Vec<(String, String)>> {
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/sandboxrun_pool_claimed?labelSelector={}",
        url::form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>()
    );
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let list: serde_json::Value = client.request(request).await.ok()?;
    let items = list["items"].as_array()?;
    Some(
        items
            .iter()
            .map(|i| {
                let pool = i["metricLabels"]["pool"].as_str().unwrap_or_default();
                (
                    pool.to_string(),
                    i["value"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

/// Issue #54 item 4 on the real node (docs/user-guide.md "Scaling a pool with a
/// HorizontalPodAutoscaler"), the operator with `--external-metrics` on its webhook's listener
/// and the bed's aggregation layer:
/// - the APIService `v1beta1.external.metrics.k8s.io` pointed at it becomes Available (the
///   operator patched its caBundle);
/// - a caller of the operator's port without the aggregation layer's front-proxy certificate is
///   refused, even naming a user in `X-Remote-User`;
/// - an HPA with an External metric `sandboxrun_pool_claimed{pool=agents}`, AverageValue 1
///   (replicas = claimed pods), keeps the pool at its minReplicas while nothing is claimed;
///   three runs made from the pool's template claim three pods, the metric says 3 through the
///   apiserver, and the HPA raises the pool to 3, whose ready pods follow;
/// - the same request for another watched namespace answers no item.
/// The kube-controller-manager's HPA syncs every 15 s (its default
/// `--horizontal-pod-autoscaler-sync-period`): each wait allows several syncs.
#[tokio::test]
async fn an_hpa_on_the_operators_external_metric_scales_a_pool_as_runs_claim_its_pods() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    use sandboxrun_operator::api::{OpenField, TemplateRef};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "hpa").await;
    let other = TestNamespace::new(&client, "hpa-other").await;
    let (_dir, store_url) = file_store("hpa");
    let ip = std::env::var("REAL_NODE_IP").unwrap_or_else(|_| "10.244.0.1".into());
    let port = free_port();
    let addr = format!("{ip}:{port}");
    let host = format!("metrics.{}.svc", ns.name);
    let watched = format!("{},{}", ns.name, other.name);
    let vwc = format!("none-{}", ns.name);
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &[
            "--warm-pools",
            "--external-metrics",
            "--namespaces",
            &watched,
            "--webhook-addr",
            &addr,
            "--webhook-cert-mode",
            "self-managed",
            "--webhook-hosts",
            &host,
            "--webhook-secret",
            "metrics-tls",
            "--webhook-config",
            &vwc,
        ],
    );
    service_to_host(&client, &ns.name, "metrics", &ip, port).await;
    let _api_service = MetricsApiService::create(&client, &ns.name, "metrics").await;
    let services: Api<APIService> = Api::all(client.clone());
    let started = Instant::now();
    eventually("the APIService Available", Duration::from_secs(90), || {
        let services = services.clone();
        async move {
            let s = services.get(METRICS_API_SERVICE).await.ok()?.status?;
            let available = s.conditions?.into_iter().find(|c| c.type_ == "Available")?;
            (available.status == "True").then_some(())
        }
    })
    .await;
    eprintln!(
        "the APIService was Available {:?} after it was created",
        started.elapsed()
    );

    // A caller that reaches the port itself (any pod may): no front-proxy certificate, so no
    // answer, whatever user it names.
    let direct = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("a client");
    let url = format!(
        "https://{addr}/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/sandboxrun_pool_claimed",
        ns.name
    );
    let forged = direct
        .get(&url)
        .header("X-Remote-User", "system:admin")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .expect("the operator answers");
    assert_eq!(forged.status().as_u16(), 401, "{:?}", forged.text().await);

    let pools = make_template_and_pool(
        &client,
        &ns.name,
        ("agent", "agents"),
        template_of(
            real_spec(Some("exit 9"), &["/work/out"]),
            &[OpenField::Command],
        ),
        1,
    )
    .await;
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "agents"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "sandbox.iterion.io/v1alpha1",
                "kind": "SandboxRunPool", "name": "agents"},
            "minReplicas": 1, "maxReplicas": 4,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "sandboxrun_pool_claimed",
                    "selector": {"matchLabels": {"pool": "agents"}}},
                "target": {"type": "AverageValue", "averageValue": "1"}}}]
        }
    }))
    .expect("an HPA");
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns.name);
    hpas.create(&Default::default(), &hpa)
        .await
        .expect("create the HPA");
    // The HPA read the metric (0 claimed) and keeps the pool at its minReplicas.
    let read = |value: &'static str| {
        let hpas = hpas.clone();
        move || {
            let hpas = hpas.clone();
            async move {
                let s = hpas.get("agents").await.ok()?.status?;
                let metric = s.current_metrics?.into_iter().next()?.external?;
                (metric.current.average_value?.0 == value).then_some(())
            }
        }
    };
    eventually("the HPA read 0 claimed", Duration::from_secs(90), read("0")).await;
    let pool_at = |n: i32| {
        let pools = pools.clone();
        move || {
            let pools = pools.clone();
            async move {
                let p = pools.get("agents").await.ok()?;
                let s = p.status?;
                (p.spec.replicas == n && s.ready_replicas == n).then_some(s)
            }
        }
    };
    eventually(
        "the pool at 1 ready pod",
        Duration::from_secs(180),
        pool_at(1),
    )
    .await;

    // Three runs made from the template: each claims a pod (the first the ready one; the pool
    // makes the next ones), and keeps it while it sleeps.
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    for i in 0..3 {
        // A ready pod to claim first (the pool replaces the one the last run took), in a
        // status that already counts the last claims: an older one still counts the pod the
        // last run took as ready, and the run would start cold.
        eventually("a ready pool pod", Duration::from_secs(180), || {
            let pools = pools.clone();
            async move {
                let s = pools.get("agents").await.ok()?.status?;
                (s.ready_replicas >= 1 && s.claimed == i).then_some(())
            }
        })
        .await;
        let spec = SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced("agent")),
            command: Some(vec!["sh".into(), "-c".into(), "sleep 600".into()]),
            ..Default::default()
        };
        create(&runs, &format!("work-{i}"), spec).await;
        let name = format!("work-{i}");
        wait_run(&runs, &name, "a run on a claimed pool pod", &op, |r| {
            r.status
                .as_ref()
                .and_then(|s| s.warm_start.as_ref())
                .is_some_and(|w| w.pod.is_some())
        })
        .await;
    }
    let claimed = Instant::now();
    eventually("the metric says 3 claimed", Duration::from_secs(90), || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            let items = claimed_metric(&client, &ns, "pool=agents").await?;
            (items == [("agents".to_string(), "3".to_string())]).then_some(())
        }
    })
    .await;
    eventually(
        "the pool raised to 3 ready pods",
        Duration::from_secs(180),
        pool_at(3),
    )
    .await;
    eprintln!(
        "the pool followed the claims {:?} after they were 3",
        claimed.elapsed()
    );
    let hpa_status = hpas.get("agents").await.expect("the HPA").status;
    assert_eq!(
        hpa_status.as_ref().map(|s| s.desired_replicas),
        Some(3),
        "{hpa_status:?}"
    );

    // Another namespace's request answers none of this namespace's pools.
    let elsewhere = claimed_metric(&client, &other.name, "pool=agents").await;
    assert_eq!(elsewhere, Some(Vec::new()));
    let everything = claimed_metric(&client, &other.name, "").await;
    assert_eq!(everything, Some(Vec::new()));
}

/// Waits until the operator at `port` holds `n` attaches open to its pool pods' launchers.
async fn wait_attaches_held(port: u16, n: f64) {
    eventually(
        &format!("the operator to hold {n} attaches open"),
        Duration::from_secs(60),
        || async move {
            (operator_metric(port, "sandboxrun_pool_attaches_held").await == Some(n)).then_some(())
        },
    )
    .await;
}

/// Creates the run `name` of the template `agent` (its command writes `run <n>` to its file),
/// waits for it and checks it succeeded with its file drained; the pool pod it took.
async fn served_warm(
    (runs, ns, store_url): (&Api<SandboxRun>, &str, &str),
    name: &str,
    n: u32,
    op: &Operator,
) -> String {
    use sandboxrun_operator::api::TemplateRef;
    let spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            format!(r#"echo "run {n}" > "$ITERION_ARTIFACT_FILES_DIR/out.txt""#),
        ]),
        ..Default::default()
    };
    create(runs, name, spec).await;
    let done = wait_run(runs, name, "the warm run to end", op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let warm = status.warm_start.clone().expect("warmStart");
    let dest = files_get(ns, name, store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, format!("run {n}\n"));
    warm.pod
        .clone()
        .unwrap_or_else(|| panic!("{name} was served warm: {warm:?}"))
}

/// Issue #55 item 1 on the real node (docs/contract.md "A claim writes its start on an attach
/// held open"): the operator holds an attach open to each ready pool pod's launcher, and a warm
/// run's start is written on it (`sandboxrun_warm_start_attaches_total{attach="held"}`). Then
/// the operator is killed with its attaches held open and started again: the launchers' stdin
/// stays open (it is not `stdinOnce`), so the pods that were ready serve the next runs warm,
/// their starts written on the new operator's held attaches. With `stdinOnce` the killed
/// operator's attaches closed the launchers' stdin and those pods could serve no run.
#[tokio::test]
async fn a_warm_start_is_written_on_a_held_attach_and_a_restart_spends_no_pool_pod() {
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let RealBed {
        client,
        ns,
        store_url,
        mut op,
        runs,
    } = RealBed::with_flags("held", &["--warm-pools", "--metrics-addr", &metrics]).await;
    ready_pool(
        &client,
        &ns.name,
        real_spec(Some("exit 9"), &["/work/out"]),
        2,
    )
    .await;
    wait_attaches_held(port, 2.0).await;
    served_warm((&runs, &ns.name, &store_url), "first", 1, &op).await;
    let held = r#"sandboxrun_warm_start_attaches_total{attach="held"}"#;
    assert_eq!(operator_metric(port, held).await, Some(1.0));

    // The pool made another; both ready pods held, then the operator killed with them open.
    wait_attaches_held(port, 2.0).await;
    let before = unclaimed_pool_pods(&client, &ns.name, "agents").await;
    assert_eq!(before.len(), 2, "{before:?}");
    op.kill();
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &["--warm-pools", "--metrics-addr", &metrics],
    );
    wait_attaches_held(port, 2.0).await;
    // Two runs at once take the two pods ready before the restart (the pool's next pods are not
    // ready yet).
    let at = (&runs, ns.name.as_str(), store_url.as_str());
    let (second, third) = futures::join!(
        served_warm(at, "second", 2, &op),
        served_warm(at, "third", 3, &op)
    );
    assert!(
        second != third && before.contains(&second) && before.contains(&third),
        "second took {second}, third {third}: the pods ready before the restart {before:?}"
    );
    assert_eq!(operator_metric(port, held).await, Some(2.0));
}
