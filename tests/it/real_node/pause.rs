//! Issue #54 item 1 on real containers: pause and resume with the workspace restored
//! (`spec.workspace.restore: Latest` with `spec.suspend`, docs/user-guide.md "Pause, resume and
//! fork"). The resumed attempt's pod is parked in the launcher, its read-back paths are restored
//! by `restore-unpack` in the holder (as the run's user), and only then does its workload start;
//! a restore that fails never starts it.

use sandboxrun_operator::api::{RestoreOutcome, Workspace, WorkspaceFrom, WorkspaceRestore};

use super::*;

/// The script both tests run: attempt 1 writes files and sleeps until it is paused; a later
/// attempt records what it finds (the file's content, its owner's uid, a nested file's size) and
/// ends.
const SCRIPT: &str = r#"D="$ITERION_ARTIFACT_FILES_DIR"
if [ "$SANDBOXRUN_ATTEMPT" -eq 1 ]; then
  echo hello > "$D/a.txt"; mkdir -p "$D/sub/deep"; head -c 300000 /dev/urandom > "$D/sub/deep/big"
  exec sleep 3600
fi
echo ran > "$D/ran.txt"
echo "$(cat "$D/a.txt") $(stat -c %u "$D/a.txt") $(stat -c %s "$D/sub/deep/big")" > "$D/seen.txt""#;

fn pausing_spec() -> SandboxRunSpec {
    let mut spec = real_spec(Some(SCRIPT), &["/work/out"]);
    spec.workspace = Some(Workspace {
        restore: WorkspaceRestore::Latest,
        ..Workspace::default()
    });
    spec
}

/// Starts `name`, waits for it to run, pauses it and waits until attempt 1 is drained.
async fn run_then_pause(bed: &RealBed, name: &str) -> SandboxRun {
    create(&bed.runs, name, pausing_spec()).await;
    wait_run(
        &bed.runs,
        name,
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    // Past the first write (the script writes at once; a moment for the shell to run).
    tokio::time::sleep(Duration::from_secs(3)).await;
    set_suspend(bed, name, true).await;
    wait_run(&bed.runs, name, "attempt 1 drained, paused", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.attempts.len() == 1
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "Suspended")
        })
    })
    .await
}

async fn set_suspend(bed: &RealBed, name: &str, on: bool) {
    bed.runs
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": on}})),
        )
        .await
        .expect("patch spec.suspend");
}

/// Paused, then resumed: the new attempt's workload finds attempt 1's files — the same content,
/// owned by the run's uid (1000), the nested file whole — and the run records where they came
/// from. On the old code the field does not exist and the resumed attempt starts empty.
#[tokio::test]
async fn a_paused_sandbox_resumes_with_its_files_restored_before_its_workload_starts() {
    let bed = RealBed::new("real-pause").await;
    let paused = run_then_pause(&bed, "agent").await;
    let first = &paused.status.as_ref().expect("status").attempts[0];
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    set_suspend(&bed, "agent", false).await;
    let done = wait_run(&bed.runs, "agent", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(
        (
            restore.attempt,
            restore.from_attempt,
            restore.outcome,
            restore.files
        ),
        (2, 1, RestoreOutcome::Restored, 2),
        "{restore:?}"
    );
    assert!(restore.delivered, "{restore:?}");
    let dir = files_get_attempt(&bed.ns.name, "agent", &bed.store_url, 2);
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.txt")).expect("seen.txt"),
        "hello 1000 300000\n"
    );
    let events = run_events(&bed.client, &bed.ns.name, "agent").await;
    assert!(
        events.iter().any(|e| e.starts_with("WorkspaceRestored:")),
        "{events:?}"
    );
}

/// A paused run whose stored archive was tampered with in the store: the resume is a
/// `RestoreFailed` Warning and `WorkspaceRestored=False`, and the workload never runs (its
/// attempt fails with the launcher's 127, and writes nothing). On the old code there is no
/// restore at all.
#[tokio::test]
async fn a_tampered_archive_makes_the_resume_a_warning_and_the_workload_never_runs() {
    let bed = RealBed::new("real-pause-tamper").await;
    let paused = run_then_pause(&bed, "agent").await;
    let object = paused.status.as_ref().expect("status").attempts[0].read_back[0]
        .object
        .clone()
        .expect("attempt 1's archive");
    let path = object
        .strip_prefix("file://")
        .unwrap_or_else(|| panic!("a file:// object: {object}"));
    let mut bytes = std::fs::read(path).expect("read the stored archive");
    assert!(bytes.len() > 1024, "{path}: {} bytes", bytes.len());
    // Flip bytes in the middle of the stored object (a tenant holds its store's credentials).
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(path, &bytes).expect("tamper with the stored archive");
    set_suspend(&bed, "agent", false).await;
    let done = wait_run(&bed.runs, "agent", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(restore.outcome, RestoreOutcome::Failed, "{restore:?}");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkspaceRestored")
        .expect("WorkspaceRestored condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "RestoreFailed"),
        "{condition:?}"
    );
    assert_eq!(status.exit_code, Some(127), "{status:?}");
    let events = run_events(&bed.client, &bed.ns.name, "agent").await;
    assert!(
        events.iter().any(|e| e.starts_with("RestoreFailed:")),
        "{events:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "agent", &bed.store_url, 2);
    assert!(
        !dir.join("ran.txt").exists(),
        "the workload never ran after a failed restore"
    );
}

/// Issue #54 item 1, warm (docs/user-guide.md "Pause, resume and fork"): with `--warm-pools` and
/// a pool of one pod of the run's template, a run that restores its workspace takes a pool pod
/// for its first attempt (nothing to restore: started at the claim) and, paused then resumed,
/// another for its second — whose read-back paths are restored in the claimed pod before its
/// start is handed over, so its workload finds attempt 1's files. On the old code both attempts
/// started cold ("the run sets spec.workspace").
#[tokio::test]
async fn a_resumed_sandbox_is_served_warm_by_a_pool_pod_with_its_files_restored() {
    use sandboxrun_operator::api::{OpenField, TemplateRef};
    let bed = RealBed::with_flags("real-pause-warm", &["--warm-pools"]).await;
    let pools = make_template_and_pool(
        &bed.client,
        &bed.ns.name,
        ("agent", "agents"),
        template_of(
            real_spec(Some("exit 9"), &["/work/out"]),
            &[OpenField::Command],
        ),
        1,
    )
    .await;
    let ready = |taken: Vec<String>| {
        let (client, ns, pools) = (bed.client.clone(), bed.ns.name.clone(), pools.clone());
        async move {
            eventually("a ready pool pod", Duration::from_secs(180), || {
                let (client, ns, pools, taken) =
                    (client.clone(), ns.clone(), pools.clone(), taken.clone());
                async move {
                    let pods = pool_pods(&client, &ns, "agents").await;
                    let fresh = pods.iter().any(|(n, _, c)| !c && !taken.contains(n));
                    let s = pools.get("agents").await.ok()?.status?;
                    (fresh && s.ready_replicas == 1).then_some(())
                }
            })
            .await
        }
    };
    ready(Vec::new()).await;
    let spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec!["sh".into(), "-c".into(), SCRIPT.into()]),
        workspace: Some(Workspace {
            restore: WorkspaceRestore::Latest,
            ..Workspace::default()
        }),
        ..Default::default()
    };
    create(&bed.runs, "agent", spec).await;
    let running = wait_run(
        &bed.runs,
        "agent",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let first = running
        .status
        .and_then(|s| s.warm_start)
        .and_then(|w| w.pod)
        .unwrap_or_else(|| panic!("attempt 1 took a pool pod"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    set_suspend(&bed, "agent", true).await;
    wait_run(
        &bed.runs,
        "agent",
        "attempt 1 drained, paused",
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
    ready(vec![first.clone()]).await;
    set_suspend(&bed, "agent", false).await;
    let done = wait_run(&bed.runs, "agent", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let warm = status.warm_start.clone().expect("warmStart");
    let second = warm.pod.clone().unwrap_or_default();
    assert_eq!(warm.attempt, Some(2), "{warm:?}");
    assert!(
        second.starts_with("agents-") && second != first,
        "attempt 2 took another pool pod: {first} then {warm:?}"
    );
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(
        (restore.attempt, restore.from_attempt, restore.outcome),
        (2, 1, RestoreOutcome::Restored),
        "{restore:?}"
    );
    assert!(restore.delivered, "{restore:?}");
    let dir = files_get_attempt(&bed.ns.name, "agent", &bed.store_url, 2);
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.txt")).expect("seen.txt"),
        "hello 1000 300000\n"
    );
}

/// A fork's script: a run without `a.txt` writes the files and ends; one that finds them (a
/// fork) records what it finds. Either writes `ran.txt`.
const FORK_SCRIPT: &str = r#"D="$ITERION_ARTIFACT_FILES_DIR"
echo ran > "$D/ran.txt"
if [ -f "$D/a.txt" ]; then
  echo "$(cat "$D/a.txt") $(stat -c %u "$D/a.txt") $(stat -c %s "$D/sub/deep/big")" > "$D/seen.txt"
else
  echo hello > "$D/a.txt"; mkdir -p "$D/sub/deep"; head -c 300000 /dev/urandom > "$D/sub/deep/big"
fi"#;

fn fork_spec(from: Option<&str>) -> SandboxRunSpec {
    let mut spec = real_spec(Some(FORK_SCRIPT), &["/work/out"]);
    spec.workspace = from.map(|run| Workspace {
        from: Some(WorkspaceFrom {
            run: run.into(),
            attempt: None,
            checkpoint: None,
        }),
        ..Workspace::default()
    });
    spec
}

/// Runs `name` (no fork) to its end: Succeeded, its files drained.
async fn source_done(bed: &RealBed, name: &str) -> SandboxRun {
    create(&bed.runs, name, fork_spec(None)).await;
    let done = wait_run(&bed.runs, name, "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    done
}

/// docs/contract.md "Pause, resume and fork": run `a` writes files and succeeds; run `b` with
/// `workspace.from: {run: a}` starts with them (the same content, owned by the run's uid, the
/// nested file whole) and records the source's name, uid and attempt. On the old code the field
/// does not exist and a first attempt starts empty.
#[tokio::test]
async fn a_fork_starts_with_its_sources_files() {
    let bed = RealBed::new("real-fork").await;
    let a = source_done(&bed, "a").await;
    create(&bed.runs, "b", fork_spec(Some("a"))).await;
    let done = wait_run(&bed.runs, "b", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(
        (
            restore.attempt,
            restore.from_run.as_deref(),
            restore.from_uid.clone(),
            restore.from_attempt,
            restore.outcome,
            restore.files
        ),
        (
            1,
            Some("a"),
            a.metadata.uid.clone(),
            1,
            RestoreOutcome::Restored,
            3
        ),
        "{restore:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "b", &bed.store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.txt")).expect("seen.txt"),
        "hello 1000 300000\n"
    );
}

/// docs/contract.md "Pause, resume and fork", issue #54: run `a` writes its files and keeps
/// running; its checkpoint 1 is taken (`spec.checkpoint`). Run `c` with `workspace.from: {run: a,
/// checkpoint: 1}` starts with that checkpoint's files (the same content, owned by the run's uid,
/// the nested file whole) while `a` still runs, and records `fromCheckpoint: 1`. On the old code
/// the field does not exist. Written while the bed was down: not run yet.
#[tokio::test]
async fn a_fork_of_a_running_sandboxs_checkpoint_starts_with_its_files() {
    let bed = RealBed::new("real-fork-ckpt").await;
    let keeps_running = format!("{FORK_SCRIPT}\nexec sleep 3600");
    let a = create(
        &bed.runs,
        "a",
        real_spec(Some(&keeps_running), &["/work/out"]),
    )
    .await;
    wait_run(&bed.runs, "a", "Running", &bed.op, phase_is(Phase::Running)).await;
    // Past the first write (the script writes at once; a moment for the shell to run).
    tokio::time::sleep(Duration::from_secs(3)).await;
    bed.runs
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"checkpoint": "c1"}})),
        )
        .await
        .expect("patch spec.checkpoint");
    wait_run(&bed.runs, "a", "checkpoint 1 saved", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.checkpoints.iter().any(|c| {
                c.index == 1
                    && !c.read_back.is_empty()
                    && c.read_back
                        .iter()
                        .all(|p| p.phase == ReadBackPhase::Drained)
            })
        })
    })
    .await;
    let mut spec = fork_spec(Some("a"));
    if let Some(from) = spec.workspace.as_mut().and_then(|w| w.from.as_mut()) {
        from.checkpoint = Some(1);
    }
    create(&bed.runs, "c", spec).await;
    let done = wait_run(&bed.runs, "c", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(
        (
            restore.from_run.as_deref(),
            restore.from_uid.clone(),
            restore.from_checkpoint,
            restore.outcome,
            restore.files
        ),
        (
            Some("a"),
            a.metadata.uid.clone(),
            Some(1),
            RestoreOutcome::Restored,
            3
        ),
        "{restore:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "c", &bed.store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.txt")).expect("seen.txt"),
        "hello 1000 300000\n"
    );
    let source = bed.runs.get("a").await.expect("get a");
    let phase = source.status.and_then(|s| s.phase);
    assert_eq!(phase, Some(Phase::Running), "the source kept running");
}

/// Run `a` succeeds, is deleted (its files kept: retention Retain) and re-created under its name,
/// suspended (nothing saved yet). A fork of `a` made now is bound to the new `a`: its restore
/// fails (`RestoreFailed`, `WorkspaceRestored=False`), its workload never runs (exit 127, no
/// `ran.txt`), and the old `a`'s files are never restored. On the old code the field does not exist.
#[tokio::test]
async fn a_fork_of_a_re_created_source_fails_its_restore_and_never_runs() {
    let bed = RealBed::new("real-fork-again").await;
    let old = source_done(&bed, "a").await;
    bed.runs
        .delete("a", &Default::default())
        .await
        .expect("delete a");
    wait_gone(&bed.runs, "a", &bed.op, Duration::from_secs(120)).await;
    let mut again = fork_spec(None);
    again.suspend = true;
    let new = create(&bed.runs, "a", again).await;
    assert_ne!(new.metadata.uid, old.metadata.uid);
    create(&bed.runs, "b2", fork_spec(Some("a"))).await;
    let done = wait_run(&bed.runs, "b2", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    assert_eq!(status.exit_code, Some(127), "{status:?}");
    let restore = status.restores.first().expect("status.restores");
    assert_eq!(restore.outcome, RestoreOutcome::Failed, "{restore:?}");
    assert_eq!(restore.from_run.as_deref(), Some("a"), "{restore:?}");
    assert_ne!(restore.from_uid, old.metadata.uid, "{restore:?}");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkspaceRestored")
        .expect("WorkspaceRestored condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "RestoreFailed"),
        "{condition:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "b2", &bed.store_url, 1);
    assert!(!dir.join("ran.txt").exists(), "the workload never ran");
    assert!(
        !dir.join("a.txt").exists(),
        "the old a's files were never restored"
    );
}
