//! Issue #42: a user's `helm upgrade` from the previous release to this one, with runs in flight,
//! on the real node. The previous release is real: the chart tree charts/RELEASED recorded for it
//! and its operator built from the commit that released it (`hack/previous-release.sh`, which
//! `make test` runs; it writes `$STATE/previous-release.env`).

use super::*;

/// What `hack/previous-release.sh` wrote: the version, its packaged chart and its pinned image.
struct PreviousRelease {
    version: String,
    chart: PathBuf,
    image: String,
}

fn previous_release() -> PreviousRelease {
    let file = state_dir().join("previous-release.env");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "no previous release ({}: {e}): run hack/previous-release.sh (make test does)",
            file.display()
        )
    });
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} missing in {}", file.display()))
            .to_string()
    };
    PreviousRelease {
        version: field("VERSION"),
        chart: PathBuf::from(field("CHART")),
        image: field("IMAGE"),
    }
}

/// The images the release's controller pods run.
async fn controller_images(client: &Client, ns: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("list the controller pods")
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
        .filter_map(|c| c.image.clone())
        .collect()
}

/// The run `name` once it satisfies `done` (no operator of this test's own to report on: the
/// release's runs in the cluster).
async fn run_reaching(
    runs: &Api<SandboxRun>,
    name: &str,
    limit: Duration,
    done: impl Fn(&SandboxRun) -> bool,
) -> SandboxRun {
    let what = format!("run {name} to get there");
    eventually(&what, limit, || async {
        runs.get(name).await.ok().filter(|r| done(r))
    })
    .await
}

/// The previous release installed by Helm runs a run to the end; then, with three runs still
/// working and one being stopped (its drain under way), `helm upgrade` moves the release to this
/// chart and image. The upgraded operator finishes every one of them: each ends as it would have
/// (Succeeded or Stopped), its file drained to S3 and read back; none is lost. Then every run is
/// deleted and is gone within a minute: no finalizer is left trapped.
#[tokio::test]
async fn helm_upgrade_from_the_previous_release_keeps_the_runs_in_flight() {
    let previous = previous_release();
    let client = client().await;
    ensure_crd(&client).await;
    let release_ns = TestNamespace::new(&client, "upgrade").await;
    let runs_ns = restricted_namespace(&client, "upgrade-runs").await;
    let s3 = s3();
    let fullname = format!("sbr-{:08x}", rand_u32());
    let store_url = format!("s3://{}/upgrade-{fullname}", s3.bucket);
    let values = json!({
        "watchNamespaces": [runs_ns.name],
        "webhook": {"namespaceSelector": {"matchLabels": {"sandboxrun-test": runs_ns.name}}},
    });
    let old_image = pod_ref(&previous.image);
    let _release = install_chart_by_helm(
        (&release_ns.name, &fullname),
        &store_url,
        values.clone(),
        (&previous.chart, &old_image),
    );
    assert_eq!(
        controller_images(&client, &release_ns.name).await,
        vec![old_image.clone()],
        "the previous release {} runs",
        previous.version
    );

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let write = |word: &str, then: &str| {
        format!(r#"echo {word} > "$ITERION_ARTIFACT_FILES_DIR/out.txt"; {then}"#)
    };
    // Ends under the previous release (the first run: the webhook's Service may lag its pod).
    create_once_webhook_answers(
        &runs,
        "early",
        real_spec(Some(&write("early", "true")), &["/work/out"]),
    )
    .await;
    let early = run_reaching(&runs, "early", Duration::from_secs(180), final_phase).await;
    assert_eq!(phase(&early), Some(Phase::Succeeded), "{:?}", early.status);
    // Still working when the upgrade starts, and after it ends.
    let working = ["long-1", "long-2", "long-3"];
    for name in working {
        let spec = real_spec(Some(&write(name, "sleep 75")), &["/work/out"]);
        create(&runs, name, spec).await;
    }
    // Told to stop just before the upgrade: its drain is under way while the operator changes.
    create(
        &runs,
        "stopped",
        real_spec(Some(&write("stopped", "sleep 600")), &["/work/out"]),
    )
    .await;
    for name in working.iter().chain(&["stopped"]) {
        run_reaching(
            &runs,
            name,
            Duration::from_secs(180),
            phase_is(Phase::Running),
        )
        .await;
    }
    let stop = json!({"spec": {"stop": true}});
    runs.patch("stopped", &PatchParams::default(), &Patch::Merge(&stop))
        .await
        .expect("stop the run");

    let new_image = pod_ref(&operator_ref());
    let values_file = helm_values_file(&fullname, &store_url, values, &new_image);
    let chart = repo().join("charts/sandboxrun-operator");
    let upgraded = run_helm(&[
        "upgrade",
        &fullname,
        &chart.display().to_string(),
        "-n",
        &release_ns.name,
        "-f",
        &values_file.display().to_string(),
        "--wait",
        "--timeout",
        "4m",
    ]);
    assert!(
        upgraded.status.success(),
        "helm upgrade from {}: {}\n{}",
        previous.version,
        String::from_utf8_lossy(&upgraded.stderr),
        describe_pods(&release_ns.name)
    );
    let images = eventually(
        "only the new operator to run",
        Duration::from_secs(120),
        || {
            let (client, ns, new_image) =
                (client.clone(), release_ns.name.clone(), new_image.clone());
            async move {
                let images = controller_images(&client, &ns).await;
                (!images.is_empty() && images.iter().all(|i| *i == new_image)).then_some(images)
            }
        },
    )
    .await;
    assert!(!images.contains(&old_image), "{images:?}");
    // The test means something only if the runs were still working when the new operator took
    // over.
    for name in working {
        let r = runs.get(name).await.expect("get run");
        assert!(
            !final_phase(&r),
            "{name} ended before the upgrade finished (make its sleep longer): {:?}",
            r.status
        );
    }

    let host_store_env = s3.host_env();
    let ended = [
        ("early", Phase::Succeeded),
        ("long-1", Phase::Succeeded),
        ("long-2", Phase::Succeeded),
        ("long-3", Phase::Succeeded),
        ("stopped", Phase::Stopped),
    ];
    for (name, want) in ended {
        let r = run_reaching(&runs, name, Duration::from_secs(240), final_phase).await;
        let status = r.status.clone().expect("status");
        assert_eq!(status.phase, Some(want), "{name}: {status:?}");
        assert_eq!(
            status.read_back[0].phase,
            ReadBackPhase::Drained,
            "{name}: {status:?}"
        );
        let dest = files_get(&runs_ns.name, name, &store_url, &[], &host_store_env)
            .unwrap_or_else(|e| panic!("files get {name} failed: {e}"));
        assert_eq!(
            std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt"),
            format!("{name}\n"),
            "{name}'s file"
        );
    }

    // None trapped: every run deleted is gone (its finalizer released by the new operator).
    for (name, _) in ended {
        runs.delete(name, &Default::default())
            .await
            .expect("delete run");
    }
    eventually("every run to be gone", Duration::from_secs(60), || {
        let runs = runs.clone();
        async move {
            let left = runs.list(&ListParams::default()).await.ok()?.items;
            left.is_empty().then_some(())
        }
    })
    .await;
}
