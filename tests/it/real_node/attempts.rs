//! A run's attempts and generations: retries by exit code, the next attempt following its drain,
//! suspend and resume, an evicted attempt retried, checkpoints (surviving a forced deletion, and
//! two hundred asked of one run).

use super::*;

/// Issue #41 on real containers: a run whose workload exits 3 on its first two attempts and 0 on
/// its third (it reads `SANDBOXRUN_ATTEMPT`) retries under `spec.retryPolicy` and Succeeds; each
/// attempt's files are drained into their own generation (`files get --attempt N`) and listed in
/// `status.attempts` with their exit code; a Warning `AttemptFailed` tells each retry. A second
/// run whose exit code 42 a `FailRun` rule names fails at once, with one attempt. On the old code
/// the first run ends `Failed` after its first attempt (no retry exists).
#[tokio::test]
async fn a_run_retries_by_exit_code_keeping_every_attempts_files_and_a_fatal_code_fails_at_once() {
    use sandboxrun_operator::api::{
        ExitCodeOperator, ExitCodeRule, RetryAction, RetryBackoff, RetryPolicy, RetryRule,
    };
    let bed = RealBed::new("real-retry").await;
    let policy = RetryPolicy {
        limit: 3,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(2),
            cap_seconds: Some(2),
        }),
        rules: vec![RetryRule {
            action: RetryAction::FailRun,
            on_exit_codes: Some(ExitCodeRule {
                operator: ExitCodeOperator::In,
                values: vec![42],
            }),
            on_pod_conditions: Vec::new(),
        }],
    };
    let flaky = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 3 ] || exit 3"#;
    let mut spec = real_spec(Some(flaky), &["/work/out"]);
    spec.retry_policy = Some(policy.clone());
    create(&bed.runs, "flaky", spec).await;
    let mut fatal = real_spec(
        Some("echo doomed > \"$ITERION_ARTIFACT_FILES_DIR/x\"; exit 42"),
        &["/work/out"],
    );
    fatal.retry_policy = Some(policy);
    create(&bed.runs, "fatal", fatal).await;

    let run = wait_run(&bed.runs, "flaky", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let ended: Vec<(u32, Option<i32>, bool)> = status
        .attempts
        .iter()
        .map(|a| (a.index, a.exit_code, a.counted))
        .collect();
    assert_eq!(
        ended,
        [(1, Some(3), true), (2, Some(3), true)],
        "{status:?}"
    );
    for a in &status.attempts {
        assert_eq!(a.read_back[0].phase, ReadBackPhase::Drained, "{a:?}");
        assert_ne!(a.pod_name, status.pod_name.clone().unwrap_or_default());
    }
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
    for attempt in 1..=3 {
        let dir = files_get_attempt(&bed.ns.name, "flaky", &bed.store_url, attempt);
        assert_eq!(
            std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
            format!("attempt {attempt}\n"),
            "attempt {attempt}'s own files"
        );
    }
    let events = run_events(&bed.client, &bed.ns.name, "flaky")
        .await
        .join("\n");
    assert!(
        events.contains("AttemptFailed") && events.contains("attempt 2 ended"),
        "each retry is told:\n{events}"
    );

    let run = wait_run(&bed.runs, "fatal", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    assert!(status.attempts.is_empty(), "no retry: {status:?}");
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("rule 1 of spec.retryPolicy fails the run"),
        "{status:?}"
    );
    assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
}

/// Issue #55 item 4 on real containers (docs/contract.md "A run's next step follows its drain"):
/// a run whose first attempt fails is retried when its 1 s backoff ends — its second attempt's pod
/// created a few seconds after the first attempt's drain ended, not after the 30 s in-flight
/// requeue the old code waited for (the drain's last write woke the run while the drain still
/// counted as in flight, and nothing woke it again).
#[tokio::test]
async fn a_retried_runs_next_attempt_follows_its_drain_not_the_in_flight_requeue() {
    use sandboxrun_operator::api::{RetryBackoff, RetryPolicy};
    let bed = RealBed::new("real-next-step").await;
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exit 3"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 1,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(1),
            cap_seconds: Some(1),
        }),
        rules: Vec::new(),
    });
    create(&bed.runs, "next", spec).await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let second = eventually_or_log(
        "the second attempt's pod",
        Duration::from_secs(180),
        &bed.op,
        || {
            let pods = pods.clone();
            async move { pods.get_opt("next-sbr-a2").await.ok().flatten() }
        },
    )
    .await;
    let done = wait_run(&bed.runs, "next", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let ended = status
        .attempts
        .first()
        .and_then(|a| a.end_time.clone())
        .expect("the first attempt's end");
    let created = second
        .metadata
        .creation_timestamp
        .clone()
        .expect("the second pod's creation");
    // Both in whole seconds; the backoff is 1 s.
    let after = created.0.duration_since(ended.0).as_secs_f64();
    assert!(
        after < 10.0,
        "attempt 2's pod was created {after} s after attempt 1 ended (backoff 1 s): the run \
         waited for something other than its backoff: {status:?}"
    );
}

/// Issue #41 `spec.suspend` on real containers: a run created suspended gets no pod (Pending,
/// Ready=False `Suspended`); resumed, it runs. Suspended while running, its pod is stopped with
/// its files drained into that attempt's generation (an attempt that does not count, reason
/// `Suspended`); resumed, attempt 2 runs in a new pod and the run ends with both generations
/// stored. On the old code the field does not exist: the run starts at once.
#[tokio::test]
async fn a_suspended_run_has_no_pod_and_a_running_one_is_stopped_with_its_files_then_resumed() {
    let bed = RealBed::new("real-suspend").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.suspend = true;
    create(&bed.runs, "held", spec).await;
    let held = wait_run(&bed.runs, "held", "Ready=False Suspended", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "Suspended")
        })
    })
    .await;
    assert_eq!(
        held.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Pending)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = pods.list(&ListParams::default()).await.expect("pods");
    assert!(
        listed.items.is_empty(),
        "no pod while suspended: {:?}",
        listed.items.len()
    );

    let set = |on: bool| json!({"spec": {"suspend": on}});
    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(false)))
        .await
        .expect("resume");
    wait_run(
        &bed.runs,
        "held",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(true)))
        .await
        .expect("suspend while running");
    let stopped = wait_run(
        &bed.runs,
        "held",
        "attempt 1 recorded, suspended",
        &bed.op,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.attempts.len() == 1
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "Suspended")
            })
        },
    )
    .await;
    let status = stopped.status.clone().expect("status");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted),
        ("Suspended", false),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    assert_eq!(status.phase, Some(Phase::Pending));

    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(false)))
        .await
        .expect("resume again");
    let done = wait_run(&bed.runs, "held", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    for attempt in 1..=2 {
        let dir = files_get_attempt(&bed.ns.name, "held", &bed.store_url, attempt);
        assert_eq!(
            std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
            format!("attempt {attempt}\n")
        );
    }
}

/// Issue #41: an attempt whose pod is evicted (a POST to pods/eviction, as `kubectl drain` does)
/// is drained, recorded as `Disrupted` and retried **without counting**: with `limit: 0` (no
/// counted retry at all) the run still gets its second attempt, which succeeds. On the old code
/// the eviction ends the run `Stopped` (`PodDeleted`).
#[tokio::test]
async fn an_evicted_attempt_is_drained_and_retried_without_counting() {
    use sandboxrun_operator::api::RetryPolicy;
    let bed = RealBed::new("real-evict-retry").await;
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 0,
        ..RetryPolicy::default()
    });
    create(&bed.runs, "evicted", spec).await;
    let run = wait_run(
        &bed.runs,
        "evicted",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let pod = pod_of(&run);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": bed.ns.name},
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        bed.ns.name, pod
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&eviction).expect("eviction json"))
    .expect("eviction request");
    let _: serde_json::Value = bed.client.request(req).await.expect("evict the pod");

    let done = wait_run(&bed.runs, "evicted", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 1, "{status:?}");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted, first.exit_code),
        ("Disrupted", false, None),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "evicted", &bed.store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
        "attempt 1\n"
    );
}

/// Issue #40 part 2 on real containers: a running sandbox asked for a checkpoint
/// (`spec.checkpoint: c1`) has its read-back paths drained without stopping it (a path whose only
/// file it cannot read is `Failed` with the drain's Warning, never an empty set) — recorded in
/// `status.checkpoints`, readable with `files get --checkpoint 1` — then writes more; a second
/// checkpoint past `--max-checkpoints 1` is refused (recorded with why, nothing drained); then its
/// pod is deleted with `--grace-period=0 --force`, so the teardown cannot read it: the
/// checkpoint's files are still in the store. On the old code the field does not exist and a
/// forced deletion loses everything.
#[tokio::test]
async fn a_checkpoint_saves_a_running_sandboxs_files_which_survive_a_forced_deletion() {
    let RealBed {
        client,
        ns,
        store_url,
        op,
        runs,
    } = RealBed::with_flags("real-checkpoint", &["--max-checkpoints", "1"]).await;
    let script = r#"echo first > "$ITERION_ARTIFACT_FILES_DIR/notes.txt"
echo secret > /work/locked/x; chmod 0000 /work/locked/x; exec sleep 3600"#;
    create(
        &runs,
        "agent",
        real_spec(Some(script), &["/work/out", "/work/locked"]),
    )
    .await;
    let running = wait_run(&runs, "agent", "Running", &op, phase_is(Phase::Running)).await;
    let pod = pod_of(&running);
    let ask = |token: &str| json!({"spec": {"checkpoint": token}});
    // The first through the plugin verb (the caller's own rights), which waits for the record:
    // exit 1, since a path failed, and it says which.
    let asked = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args(["checkpoint", "agent", "--token", "c1", "-n", &ns.name])
        .output()
        .expect("run the checkpoint verb");
    let said = String::from_utf8_lossy(&asked.stdout).to_string();
    assert_eq!(asked.status.code(), Some(1), "a path failed: {asked:?}");
    assert!(
        said.contains("checkpoint 1 (token c1)")
            && said.contains("/work/out: Drained")
            && said.contains("/work/locked: Failed")
            && said.contains("files get agent --checkpoint 1"),
        "{said}"
    );
    let saved = wait_run(&runs, "agent", "checkpoint 1 recorded", &op, |r| {
        r.status.as_ref().is_some_and(|s| !s.checkpoints.is_empty())
    })
    .await;
    let status = saved.status.clone().expect("status");
    let cp = &status.checkpoints[0];
    assert_eq!((cp.index, cp.token.as_str()), (1, "c1"), "{cp:?}");
    assert_eq!(cp.read_back[0].phase, ReadBackPhase::Drained, "{cp:?}");
    // A failed checkpoint path is Failed and a Warning, never an empty set.
    assert_eq!(cp.read_back[1].phase, ReadBackPhase::Failed, "{cp:?}");
    let events = run_events(&client, &ns.name, "agent").await.join("\n");
    assert!(
        events.contains("sandbox_runfiles_drain_failed"),
        "the failed checkpoint path is told:\n{events}"
    );
    assert_eq!(
        status.phase,
        Some(Phase::Running),
        "the sandbox keeps running"
    );
    let more = exec_in_workload(&ns.name, &pod, "echo second >> /work/out/notes.txt");
    assert!(more.status.success(), "{more:?}");

    runs.patch("agent", &PatchParams::default(), &Patch::Merge(&ask("c2")))
        .await
        .expect("ask a second checkpoint");
    let refused = wait_run(&runs, "agent", "checkpoint 2 refused", &op, |r| {
        r.status.as_ref().is_some_and(|s| s.checkpoints.len() == 2)
    })
    .await;
    let second = &refused.status.as_ref().expect("status").checkpoints[1];
    assert!(
        second.read_back.is_empty()
            && second
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("--max-checkpoints"),
        "{second:?}"
    );

    let mut force = tool("kubectl");
    force.args([
        "delete",
        "pod",
        &pod,
        "-n",
        &ns.name,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let out = run(force, None);
    assert!(out.status.success(), "{out:?}");
    wait_run(&runs, "agent", "a final phase", &op, final_phase).await;
    let dest = files_get_checkpoint(&ns.name, "agent", &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dest.join("notes.txt")).expect("notes.txt"),
        "first\n",
        "the checkpoint's copy, taken before the second line"
    );
}

/// Issue #51 item 2 on real containers (docs/contract.md "A run's object stays bounded"): a
/// running sandbox whose author asks 200 checkpoints, one after another, under
/// `--max-checkpoints 2`: every token is answered, 2 checkpoints hold files, only the latest 4
/// refusals stay listed, all 198 are counted, and the object stays small. On the old code every
/// refusal was appended: 200 entries.
#[tokio::test]
async fn a_run_asked_two_hundred_checkpoints_keeps_a_bounded_object() {
    // The namespace is bound (`_ns`) so that it lives to the test's end.
    let RealBed {
        ns: _ns, op, runs, ..
    } = RealBed::with_flags("bounded-run", &["--max-checkpoints", "2"]).await;
    let script = r#"echo hi > "$ITERION_ARTIFACT_FILES_DIR/notes.txt"; exec sleep 3600"#;
    create(&runs, "patched", real_spec(Some(script), &["/work/out"])).await;
    wait_run(&runs, "patched", "Running", &op, phase_is(Phase::Running)).await;
    for i in 0..200 {
        let token = format!("t{i}");
        runs.patch(
            "patched",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"checkpoint": token}})),
        )
        .await
        .expect("ask a checkpoint");
        wait_run(
            &runs,
            "patched",
            &format!("checkpoint {token} answered"),
            &op,
            |r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.checkpoints.last())
                    .is_some_and(|c| c.token == token)
            },
        )
        .await;
    }
    let run = runs.get("patched").await.expect("run");
    let status = run.status.clone().expect("status");
    let held = status
        .checkpoints
        .iter()
        .filter(|c| !c.is_refused())
        .count();
    assert_eq!(held, 2, "{:?}", status.checkpoints);
    assert!(
        status.checkpoints.len() <= 2 + sandboxrun_operator::api::REFUSED_CHECKPOINTS_KEPT,
        "{} entries",
        status.checkpoints.len()
    );
    assert_eq!(status.checkpoints_refused, Some(198));
    let size = serde_json::to_vec(&run).expect("json").len();
    assert!(size < 32 * 1024, "the run is {size} bytes");
    let _ = runs
        .patch(
            "patched",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    wait_run(&runs, "patched", "a final phase", &op, final_phase).await;
}
