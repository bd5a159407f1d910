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

/// `chart` (a directory, or a packaged .tgz) copied to a directory of its own with its default
/// image pinned to `image`, as `make release` pins a release's chart to its image: a user who
/// installs a release sets no image value, so an upgrade that keeps the user's values still moves
/// to the new release's image.
fn pinned_chart(chart: &Path, image: &str) -> PathBuf {
    let dir = host_dir("pinned-chart").join(format!("{:08x}", rand_u32()));
    std::fs::create_dir_all(&dir).expect("chart dir");
    let copied = if chart.is_dir() {
        Command::new("cp")
            .arg("-r")
            .arg(chart)
            .arg(dir.join("sandboxrun-operator"))
            .output()
    } else {
        Command::new("tar")
            .arg("-xzf")
            .arg(chart)
            .arg("-C")
            .arg(&dir)
            .output()
    }
    .expect("copy the chart");
    assert!(copied.status.success(), "{copied:?}");
    let root = dir.join("sandboxrun-operator");
    let values_path = root.join("values.yaml");
    let text = std::fs::read_to_string(&values_path).expect("values.yaml");
    let mut values: serde_yaml::Value = serde_yaml::from_str(&text).expect("values.yaml parses");
    let (repository, digest) = image.split_once('@').expect("a pinned image");
    values["image"]["repository"] = repository.into();
    values["image"]["digest"] = digest.into();
    values["image"]["tag"] = "".into();
    std::fs::write(&values_path, serde_yaml::to_string(&values).expect("yaml")).expect("write");
    root
}

/// The upgrade's commands exactly as docs/operations.md "Upgrade" gives them (the shell block
/// between its `upgrade-commands` markers), each with the user's own names put in: the release
/// `sbr` → `fullname`, its namespace `sandboxrun-system` → `release_ns`, and
/// `charts/sandboxrun-operator` → `chart` (the new release's chart, pinned to its image). A
/// document whose commands no longer name these fails here, saying so.
fn documented_upgrade(fullname: &str, release_ns: &str, chart: &Path) -> Vec<String> {
    let docs = std::fs::read_to_string(repo().join("docs/operations.md")).expect("operations.md");
    let start = docs
        .find("<!-- upgrade-commands")
        .expect("docs/operations.md marks its upgrade commands");
    let block = &docs[start..];
    let block = &block[block.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    let lines: Vec<String> = block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert!(
        lines.iter().any(|l| l.starts_with("kubectl apply"))
            && lines.iter().any(|l| l.starts_with("helm upgrade")),
        "the documented upgrade applies the CRDs and upgrades the release: {lines:?}"
    );
    lines
        .into_iter()
        .map(|line| {
            if !line.starts_with("helm upgrade") {
                return line;
            }
            for word in [
                " sbr ",
                " sandboxrun-system",
                " charts/sandboxrun-operator ",
            ] {
                assert!(
                    line.contains(word),
                    "the documented upgrade names `{word}`: {line}"
                );
            }
            line.replacen(" sbr ", &format!(" {fullname} "), 1)
                .replacen(" sandboxrun-system", &format!(" {release_ns}"), 1)
                .replacen(
                    " charts/sandboxrun-operator ",
                    &format!(" {} ", chart.display()),
                    1,
                )
        })
        .collect()
}

/// Runs one documented command as a user's shell would, in the repository, against the bed.
fn run_documented(line: &str) -> Output {
    let path = match tools_bin() {
        Some(bin) => format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        None => std::env::var("PATH").unwrap_or_default(),
    };
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", line])
        .current_dir(repo())
        .env("KUBECONFIG", kubeconfig_path())
        .env("PATH", path);
    run(cmd, None)
}

/// A SandboxRunTemplate `batch-tools` in `ns`: the real node, busybox, `/work/out` read back; a
/// run made from it sets its command (issue #53: GitOps runs are made from templates).
async fn batch_template(client: &Client, ns: &str) {
    let mut spec = real_spec(None, &["/work/out"]);
    spec.command = None;
    let template = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunTemplate",
        "metadata": {"name": "batch-tools", "namespace": ns},
        "spec": {"template": spec, "openFields": ["command"]},
    });
    let resource = ApiResource {
        group: "sandbox.iterion.io".into(),
        version: "v1alpha1".into(),
        api_version: "sandbox.iterion.io/v1alpha1".into(),
        kind: "SandboxRunTemplate".into(),
        plural: "sandboxruntemplates".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let object: DynamicObject = serde_json::from_value(template).expect("a template");
    api.create(&Default::default(), &object)
        .await
        .expect("create the template");
}

/// A run of the template `batch-tools` whose command is `script`.
fn templated_spec(script: &str) -> SandboxRunSpec {
    SandboxRunSpec {
        template_ref: Some(sandboxrun_operator::api::TemplateRef {
            kind: Default::default(),
            name: "batch-tools".into(),
        }),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    }
}

/// The previous release installed by Helm (its chart pinned to its image, as a release is) runs a
/// run to the end; then, with three runs and a run made from a template still working and one
/// being stopped (its drain under way), the upgrade commands of docs/operations.md, run as
/// written, move the release to this chart and image (issue #53: the docs applied three of the
/// four CRDs and froze the old chart's defaults with `--reuse-values`). The upgraded operator finishes every one of them: each ends as it would have
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
    let old_chart = pinned_chart(&previous.chart, &old_image);
    // Installed as a user installs a release: no image among the values (the chart says which).
    let _release = install_chart_by_helm(
        (&release_ns.name, &fullname),
        &store_url,
        values.clone(),
        (&old_chart, ""),
    );
    batch_template(&client, &runs_ns.name).await;
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
    let working = ["long-1", "long-2", "long-3", "templated"];
    for name in working {
        let spec = match name {
            "templated" => templated_spec(&write(name, "sleep 75")),
            _ => real_spec(Some(&write(name, "sleep 75")), &["/work/out"]),
        };
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
    let chart = pinned_chart(&repo().join("charts/sandboxrun-operator"), &new_image);
    for line in documented_upgrade(&fullname, &release_ns.name, &chart) {
        let done = run_documented(&line);
        assert!(
            done.status.success(),
            "`{line}` (docs/operations.md \"Upgrade\", from {}): {}\n{}",
            previous.version,
            String::from_utf8_lossy(&done.stderr),
            describe_pods(&release_ns.name)
        );
    }
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

    // A templated run made after the upgrade runs too (with warm pools on by default, its
    // reconcile lists the namespace's pools: without the pool CRD it starts cold).
    // Created once the new operator's webhook answers (its Service may lag its new pod).
    create_once_webhook_answers(
        &runs,
        "templated-after",
        templated_spec(&write("templated-after", "true")),
    )
    .await;

    let host_store_env = s3.host_env();
    let ended = [
        ("early", Phase::Succeeded),
        ("long-1", Phase::Succeeded),
        ("long-2", Phase::Succeeded),
        ("long-3", Phase::Succeeded),
        ("templated", Phase::Succeeded),
        ("templated-after", Phase::Succeeded),
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
