//! Runs queued through real Kueue: admission, preemption and retry, a removed queue label, a
//! priority label edit, and `waitForPodsReady`.

use super::*;

/// Issue #41 part 2 on the real node with the real Kueue (v0.17, hack/kueue.sh; the operator's
/// `--kueue`): runs labelled with a LocalQueue get a Workload and no pod until Kueue admits them.
/// - Six runs in a queue with quota for two: never more than two of their pods at once, a run
///   seen waiting (`Queued=True`, Kueue's reason), all six Succeeded with their files.
/// - Two low-priority runs fill the quota; a high-priority run preempts one of them: its attempt
///   ends `Preempted` (not counted) with its files drained, the high run succeeds, and the
///   preempted run, admitted again, succeeds in its second attempt.
#[tokio::test]
async fn runs_queue_through_real_kueue_and_a_preempted_run_is_drained_and_retried() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let queued = |script: &str, class: Option<&str>| {
        let mut spec = real_spec(Some(script), &["/work/out"]);
        spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
            )])),
            ..Default::default()
        });
        let mut labels =
            BTreeMap::from([("kueue.x-k8s.io/queue-name".to_string(), "lq".to_string())]);
        if let Some(class) = class {
            labels.insert("kueue.x-k8s.io/priority-class".into(), class.to_string());
        }
        (spec, labels)
    };
    let submit = |name: String, (spec, labels): (SandboxRunSpec, BTreeMap<String, String>)| {
        let runs = runs.clone();
        async move {
            let mut run = SandboxRun::new(&name, spec);
            run.metadata.labels = Some(labels);
            runs.create(&Default::default(), &run)
                .await
                .expect("create the run");
        }
    };

    // Six runs, quota for two.
    let script = r#"echo "$HOSTNAME" > "$ITERION_ARTIFACT_FILES_DIR/who.txt"; sleep 4"#;
    for i in 1..=6 {
        submit(format!("q{i}"), queued(script, None)).await;
    }
    let (mut most, mut saw_queued, mut placed) = (0usize, false, false);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items;
        placed |= listed.iter().any(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref())
                .is_some_and(|s| {
                    s.get("kubernetes.io/hostname").map(String::as_str) == Some("real-node-0")
                })
        });
        let live = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        most = most.max(live);
        let all = runs
            .list(&ListParams::default())
            .await
            .expect("list runs")
            .items;
        saw_queued |= all.iter().any(|r| {
            r.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Queued" && c.status == "True" && c.reason == "Pending")
            })
        });
        if all.len() == 6 && all.iter().all(final_phase) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the six runs did not end: {:#?}\n{}",
            all.iter()
                .map(|r| (
                    r.name_any(),
                    r.status.as_ref().and_then(|s| s.message.clone())
                ))
                .collect::<Vec<_>>(),
            {
                let log = op.log_text();
                log[log.len().saturating_sub(4000)..].to_string()
            }
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(most <= 2, "at most two pods at once, saw {most}");
    assert!(saw_queued, "a run waited in the queue with Kueue's reason");
    assert!(placed, "the admitted flavor's node label is on the pods");
    for i in 1..=6 {
        let name = format!("q{i}");
        let run = runs.get(&name).await.expect("run");
        assert_eq!(
            phase(&run),
            Some(Phase::Succeeded),
            "{name}: {:?}",
            run.status
        );
        let dir = files_get_attempt(&ns.name, &name, &store_url, 1);
        let who = std::fs::read_to_string(dir.join("who.txt")).expect("who.txt");
        assert!(who.starts_with(&name), "{name}: its own files: {who:?}");
    }

    // Preemption: two low runs fill the quota, a high one takes a place.
    let low_script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let (low, high) = (format!("{tag}-low"), format!("{tag}-high"));
    for name in ["low-1", "low-2"] {
        submit(name.to_string(), queued(low_script, Some(&low))).await;
    }
    for name in ["low-1", "low-2"] {
        wait_run(&runs, name, "Running", &op, phase_is(Phase::Running)).await;
    }
    submit("high".to_string(), queued("sleep 2", Some(&high))).await;
    let high_done = wait_run(&runs, "high", "the high run to end", &op, final_phase).await;
    assert_eq!(
        phase(&high_done),
        Some(Phase::Succeeded),
        "{:?}",
        high_done.status
    );
    let mut preempted = Vec::new();
    for name in ["low-1", "low-2"] {
        let run = runs.get(name).await.expect("run");
        if run.status.as_ref().is_some_and(|s| !s.attempts.is_empty()) {
            preempted.push(name);
        }
    }
    assert_eq!(
        preempted.len(),
        1,
        "one low run was preempted: {preempted:?}"
    );
    let victim = preempted[0];
    let done = wait_run(&runs, victim, "the preempted run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted),
        ("Preempted", false),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    let dir = files_get_attempt(&ns.name, victim, &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
        "attempt 1\n",
        "the preempted attempt's files were drained"
    );
    // The other low run still holds its place: stop it, then clean Kueue's cluster objects.
    for name in ["low-1", "low-2"] {
        let _ = runs
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"stop": true}})),
            )
            .await;
    }
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #51 item 5 on the real node with the real Kueue (docs/contract.md "Quota cannot be edited
/// away"): a run waiting for quota it will not get (900m of cpu, the queue has 700m) records its
/// queue in `status.queue`; its `kueue.x-k8s.io/queue-name` label removed (no webhook here: the
/// operator must hold it on its own), it still gets no pod, and says why
/// (`Queued=True QueueLabelChanged`). On the old code its pod was created at once.
#[tokio::test]
async fn a_queued_run_whose_queue_label_is_removed_gets_no_pod() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-label").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-label");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = real_spec(Some("sleep 2"), &["/work/out"]);
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("900m".into()),
        )])),
        ..Default::default()
    });
    let mut run = SandboxRun::new("over-quota", spec);
    run.metadata.labels = Some(BTreeMap::from([(
        "kueue.x-k8s.io/queue-name".to_string(),
        "lq".to_string(),
    )]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the run");
    let reason_of = |r: &SandboxRun| {
        r.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Queued" && c.status == "True")
                .map(|c| c.reason.clone())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let live = runs.get("over-quota").await.expect("run");
        let recorded = live.status.as_ref().and_then(|s| s.queue.clone());
        if recorded.as_deref() == Some("lq") && reason_of(&live).as_deref() == Some("Pending") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run was not seen waiting for quota: {:?}\n{}",
            live.status,
            op.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    runs.patch(
        "over-quota",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": null}}})),
    )
    .await
    .expect("remove the label");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut told = false;
    while Instant::now() < deadline {
        let listed = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items;
        assert!(
            listed.is_empty(),
            "a pod was created for a run whose queue label was removed: {:?}",
            listed.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        let live = runs.get("over-quota").await.expect("run");
        told |= reason_of(&live).as_deref() == Some("QueueLabelChanged");
        if told {
            // Still no pod a few seconds after it said so.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let listed = pods.list(&ListParams::default()).await.expect("list pods");
            assert!(listed.items.is_empty(), "no pod, ever");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        told,
        "the run says its label was changed\n{}",
        op.log_text()
    );
    let _ = runs
        .patch(
            "over-quota",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #53 item 1 on the real node with the real Kueue (docs/contract.md "A queued run keeps the
/// queue and priority it was queued with"): a queued run admitted at WorkloadPriorityClass
/// `<tag>-low`, its pod running, has its `kueue.x-k8s.io/priority-class` label changed to
/// `<tag>-high` (no webhook here: the operator must say it on its own). Its Workload keeps the
/// priority it was queued with, and the run says the edit is not followed —
/// `LabelEditIgnored=True PriorityLabelChanged` and a Warning Event `QueueLabelEditIgnored`; put
/// back, the condition turns False. On the old code nothing was said.
#[tokio::test]
async fn a_running_queued_runs_priority_label_edit_is_said_and_its_workload_keeps_its_priority() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-prio").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-prio");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = real_spec(Some("sleep 120"), &["/work/out"]);
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
        )])),
        ..Default::default()
    });
    let mut run = SandboxRun::new("prio", spec);
    let (low, high) = (format!("{tag}-low"), format!("{tag}-high"));
    run.metadata.labels = Some(BTreeMap::from([
        ("kueue.x-k8s.io/queue-name".to_string(), "lq".to_string()),
        ("kueue.x-k8s.io/priority-class".to_string(), low.clone()),
    ]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the run");
    let condition = |r: &SandboxRun, t: &str| {
        r.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        })
    };
    wait_run(&runs, "prio", "admitted and running", &op, |r| {
        phase(r) == Some(Phase::Running)
            && condition(r, "Queued") == Some(("False".into(), "Admitted".into()))
    })
    .await;
    let label =
        |class: &str| json!({"metadata": {"labels": {"kueue.x-k8s.io/priority-class": class}}});
    runs.patch(
        "prio",
        &PatchParams::default(),
        &Patch::Merge(&label(&high)),
    )
    .await
    .expect("change the priority label");
    let said = wait_run(&runs, "prio", "LabelEditIgnored=True", &op, |r| {
        condition(r, "LabelEditIgnored") == Some(("True".into(), "PriorityLabelChanged".into()))
    })
    .await;
    assert_eq!(
        phase(&said),
        Some(Phase::Running),
        "it runs on: {:?}",
        said.status
    );
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    let w = workloads.get("prio-sbr").await.expect("the run's Workload");
    assert_eq!(
        w.data["spec"]["priority"],
        json!(10),
        "{:?}",
        w.data["spec"]
    );
    assert_eq!(w.data["spec"]["priorityClassRef"]["name"], json!(low));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = run_events(&client, &ns.name, "prio").await;
        if events
            .iter()
            .any(|e| e.starts_with("QueueLabelEditIgnored: ") && e.contains(&high))
        {
            break;
        }
        assert!(Instant::now() < deadline, "no Warning Event: {events:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    runs.patch("prio", &PatchParams::default(), &Patch::Merge(&label(&low)))
        .await
        .expect("put the priority label back");
    wait_run(&runs, "prio", "LabelEditIgnored=False", &op, |r| {
        condition(r, "LabelEditIgnored") == Some(("False".into(), "LabelsAsQueued".into()))
    })
    .await;
    let _ = runs
        .patch(
            "prio",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    wait_run(&runs, "prio", "a final phase", &op, final_phase).await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #53 item 1 on the real node with the real Kueue running `waitForPodsReady` (hack/kueue.sh:
/// a short timeout, `KUEUE_PODS_READY_TIMEOUT`, 60s): a queued run whose pod becomes ready gets
/// `PodsReady=True` on its Workload and outlives the timeout (on the old code nothing wrote
/// PodsReady and Kueue evicted it after the timeout); a queued run whose pod is never ready (its
/// nodeSelector matches no node) is evicted by Kueue for `PodsReadyTimeout`, its attempt recorded
/// `Preempted` (never counted), and queued again.
#[tokio::test]
async fn a_ready_queued_run_outlives_kueues_pods_ready_timeout_and_a_never_ready_one_is_requeued() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-ready").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-ready");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let queued = |name: &str, script: &str, nowhere: bool| {
        let mut spec = real_spec(Some(script), &["/work/out"]);
        spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
            )])),
            ..Default::default()
        });
        if nowhere {
            spec.node_selector = Some(BTreeMap::from([(
                "sandbox.iterion.io/nowhere".to_string(),
                "true".to_string(),
            )]));
        }
        let mut run = SandboxRun::new(name, spec);
        run.metadata.labels = Some(BTreeMap::from([(
            "kueue.x-k8s.io/queue-name".to_string(),
            "lq".to_string(),
        )]));
        run
    };
    // Longer than the bed's 60s timeout.
    let script = r#"echo ready > "$ITERION_ARTIFACT_FILES_DIR/ready.txt"; sleep 80"#;
    for run in [
        queued("ready", script, false),
        queued("never-ready", "sleep 5", true),
    ] {
        runs.create(&Default::default(), &run)
            .await
            .expect("create the run");
    }
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    let pods_ready = |w: &DynamicObject| {
        w.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodsReady")
            .map(|c| (c["status"].to_string(), c["reason"].to_string()))
    };
    // An attempt ended by Kueue's eviction, never counted; Kueue counts its PodsReadyTimeout
    // evictions in the Workload's requeueState (only that eviction increments it).
    let evicted_for_timeout = |r: &SandboxRun, w: Option<&DynamicObject>| {
        let attempt = r.status.as_ref().is_some_and(|s| {
            s.attempts
                .iter()
                .any(|a| a.reason == "Preempted" && !a.counted)
        });
        let timed_out = w.is_some_and(|w| {
            w.data["status"]["requeueState"]["count"]
                .as_i64()
                .is_some_and(|n| n >= 1)
        });
        attempt && timed_out
    };
    let (mut saw_ready, mut requeued) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(w) = workloads.get("ready-sbr").await {
            saw_ready |= pods_ready(&w) == Some(("\"True\"".into(), "\"Started\"".into()));
        }
        let ready = runs.get("ready").await.expect("run");
        let never = runs.get("never-ready").await.expect("run");
        assert!(
            !final_phase(&never),
            "the never-ready run is requeued, not ended: {:?}",
            never.status
        );
        let never_workload = workloads.get("never-ready-sbr").await.ok();
        requeued |= evicted_for_timeout(&never, never_workload.as_ref());
        if final_phase(&ready) && requeued {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ready: {:?}\nnever-ready: {:?}\n{}",
            ready.status,
            never.status,
            {
                let log = op.log_text();
                log[log.len().saturating_sub(4000)..].to_string()
            }
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        saw_ready,
        "the ready run's Workload said PodsReady=True Started"
    );
    let ready = runs.get("ready").await.expect("run");
    assert_eq!(phase(&ready), Some(Phase::Succeeded), "{:?}", ready.status);
    let attempts = ready
        .status
        .as_ref()
        .map(|s| s.attempts.clone())
        .unwrap_or_default();
    assert!(
        attempts.iter().all(|a| a.reason != "Preempted"),
        "the ready run was never evicted: {attempts:?}"
    );
    let dir = files_get_attempt(&ns.name, "ready", &store_url, 1);
    let kept = std::fs::read_to_string(dir.join("ready.txt")).expect("ready.txt");
    assert_eq!(kept.trim(), "ready");
    let _ = runs
        .patch(
            "never-ready",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}
