//! Issue #40's session verbs on real containers (issue #52: under runc, under gVisor and on the
//! second node, as hack/test.sh runs this area): `kubectl sandboxrun exec` and `cp` through the
//! apiserver and the kubelet into a live sandbox, the bytes `cp` put in drained with the rest.

use super::*;

/// A live sandbox on a real node: `exec` returns the command's output and exit code, `cp` copies
/// every byte value into a read-back path and out again (the workload sees what was copied in),
/// a path outside the read-back paths is refused, and the copied file is drained with the rest
/// when the run stops.
#[tokio::test]
async fn exec_and_cp_reach_a_live_sandbox_on_a_real_node_and_the_copy_is_drained() {
    let bed = RealBed::new("real-session").await;
    create(
        &bed.runs,
        "agent",
        real_spec(Some("exec sleep 3600"), &["/work/out"]),
    )
    .await;
    wait_run(
        &bed.runs,
        "agent",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let dir = host_dir("real-session-plugin");
    // `kubectl sandboxrun args…` with this build as the plugin, the bed's kubeconfig.
    let path = link_plugin(&dir);
    let sandboxrun = |args: &[&str]| run(plugin(&path, None, args), None);
    let ns = bed.ns.name.as_str();

    let script = "echo from the sandbox; echo to stderr >&2; mkdir -p /work/out/notes; exit 7";
    let done = sandboxrun(&["exec", "agent", "-n", ns, "--", "sh", "-c", script]);
    assert_eq!(done.status.code(), Some(7), "{done:?}");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "from the sandbox\n");
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("to stderr"),
        "{done:?}"
    );

    let bytes: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let local = dir.join("in.bin");
    std::fs::write(&local, &bytes).expect("write");
    let inside = "agent:/work/out/notes/in.bin";
    let put = sandboxrun(&["cp", "-n", ns, &local.display().to_string(), inside]);
    assert!(put.status.success(), "{put:?}");
    let seen = sandboxrun(&[
        "exec",
        "agent",
        "-n",
        ns,
        "--",
        "sha256sum",
        "/work/out/notes/in.bin",
    ]);
    assert!(
        String::from_utf8_lossy(&seen.stdout).starts_with(&sha256_hex(&bytes)),
        "the workload sees the bytes copied in: {seen:?}"
    );
    let back = dir.join("back.bin");
    let got = sandboxrun(&["cp", "-n", ns, inside, &back.display().to_string()]);
    assert!(got.status.success(), "{got:?}");
    assert_eq!(std::fs::read(&back).expect("copied out"), bytes);
    let refused = sandboxrun(&[
        "cp",
        "-n",
        ns,
        "agent:/etc/passwd",
        &back.display().to_string(),
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("read-back paths"),
        "{refused:?}"
    );

    bed.runs
        .patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let done = wait_run(&bed.runs, "agent", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let dest = files_get(ns, "agent", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_eq!(
        std::fs::read(extracted(&dest, 0).join("notes/in.bin")).expect("the copy, drained"),
        bytes
    );
}
