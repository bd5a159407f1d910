//! The GitOps fixtures (`tests/gitops-fixtures/*.yaml`), generated: each is a run in one moment
//! of its life with the status the controller's own pipeline gives it (decide → plan, the
//! teardown's opening and end), so the Argo CD and Flux health checks of `deploy/gitops/` are
//! judged (tests/it/gitops.rs) against what the operator really writes (docs/gitops.md).
//! Only the verdicts each moment must get (`# expect:`) and the drains' outcomes (act's I/O)
//! are written here by hand.
//!
//! `hack/gen.sh` writes them (this test with `SANDBOXRUN_WRITE_GITOPS_FIXTURES=<dir>`); without
//! that variable the test fails when a committed fixture differs from its generated text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::fixtures::{at, now, pod_with_workload, settings};
use crate::api::{ReadBack, ReadBackPath, ReadBackPhase, Retention, SandboxRun, SandboxRunSpec};
use crate::caps::CapSettings;
use crate::controller::pod_view::{PodProblem, PodView, WorkloadState};
use crate::controller::run::decide::{self, Step};
use crate::controller::run::plan::{self, Inputs, PathWork, StepPlan, TeardownPlan};
use crate::pod::PodSettings;

/// The variable that makes the test write the fixtures into a directory instead of comparing.
const WRITE_TO: &str = "SANDBOXRUN_WRITE_GITOPS_FIXTURES";

const POD_NAME: &str = "r-sbr";

/// One fixture: its file, the verdicts the health checks must give, the run.
struct Fixture {
    file: &'static str,
    argocd: &'static str,
    flux: &'static str,
    run: SandboxRun,
}

/// A run as a user applies it: a batch workload, or a long-lived sandbox (no command).
fn applied(long_lived: bool) -> SandboxRun {
    let mut run = SandboxRun::new(
        "r",
        SandboxRunSpec {
            image: Some("alpine".into()),
            user: Some("1000".into()),
            command: (!long_lived).then(|| vec!["sh".into(), "-c".into(), "true".into()]),
            read_back: Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/out".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    run.metadata.namespace = Some("ns".into());
    run.metadata.generation = Some(1);
    run
}

/// The run once the operator holds it (its finalizer and uid, created a minute ago).
fn held(long_lived: bool) -> SandboxRun {
    let mut run = applied(long_lived);
    run.metadata.uid = Some("u1".into());
    run.metadata.finalizers = Some(vec![crate::api::FINALIZER.to_string()]);
    run.metadata.creation_timestamp = Some(Time(at(-60)));
    run
}

fn view(holder_running: bool, workload: WorkloadState) -> PodView {
    PodView {
        deleting: false,
        holder_running,
        workload,
        started_at: holder_running.then(|| at(-50)),
        pending_since: Some(at(-55)),
        problem: None,
        host_ip: None,
        gate_waiting: false,
    }
}

/// One reconcile of `run` with its pod seen as `pod`: the run with the status it plans.
fn reconciled(mut run: SandboxRun, pod: &PodView) -> SandboxRun {
    let pod_settings = PodSettings::default();
    let rules = crate::policy::RuleSettings::default();
    let step = decide::decide(&run, Some(pod), now(), &settings());
    let inputs = Inputs {
        run: &run,
        pod_name: POD_NAME,
        pod: Some(pod),
        now: now(),
        pod_settings: &pod_settings,
        rules: &rules,
        rights_unverified: None,
        last_create_attempt: None,
        default_retention: Retention::Retain,
        settle: plan::SETTLE,
        proxy_pods: &[],
    };
    let label = step.as_str();
    let status = match plan::plan_step(step, &inputs) {
        StepPlan::Carry(p) => p.status,
        other => panic!("{label} planned {other:?}, not a status"),
    };
    run.status = Some(status.unwrap_or_else(|| panic!("{label} wrote no status")));
    run
}

/// A pod whose workload exited with `exit_code` and whose holder runs.
fn exited_pod(exit_code: i32) -> Pod {
    pod_with_workload(
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                started_at: Some(Time(at(-50))),
                finished_at: Some(Time(at(-1))),
                ..Default::default()
            }),
            ..Default::default()
        },
        None,
    )
}

/// The teardown that the next reconcile of `run` begins, its pod being `pod` (serving its
/// read-back slots).
fn teardown(run: &SandboxRun, pod: &Pod) -> TeardownPlan {
    let pod = &super::fixtures::with_slots(pod.clone(), run);
    match decide::decide(run, Some(&PodView::of(pod)), now(), &settings()) {
        Step::Teardown(trigger) => plan::teardown(
            run,
            Some(pod),
            &trigger,
            &CapSettings::default(),
            300,
            now(),
        ),
        other => panic!("expected a teardown, the run decides {other:?}"),
    }
}

/// `run` while its teardown drains (the status written when the teardown begins).
fn draining(mut run: SandboxRun, pod: &Pod) -> SandboxRun {
    let status = teardown(&run, pod).opening.status;
    run.status = Some(status.unwrap_or_else(|| panic!("the teardown wrote no opening status")));
    run
}

/// `run` once its teardown ended, each drained path's outcome being `outcome` (what act's
/// drains record; `Failed` after 3 attempts with the store unreachable).
fn ended(mut run: SandboxRun, pod: &Pod, outcome: ReadBackPhase) -> SandboxRun {
    let t = teardown(&run, pod);
    let mut status = t.status;
    for p in &t.paths {
        let entry = &mut status.read_back[p.entry];
        match (&p.work, outcome) {
            (PathWork::Record(recorded), _) => *entry = recorded.clone(),
            (PathWork::Drain { .. }, ReadBackPhase::Failed) => {
                entry.phase = ReadBackPhase::Failed;
                entry.attempts = 3;
                entry.message = Some("store unreachable".into());
            }
            (PathWork::Drain { .. }, phase) => {
                entry.phase = phase;
                entry.attempts = 1;
                entry.bytes = 10;
                entry.members = 2;
            }
        }
    }
    let end = plan::teardown_end(
        &run,
        status,
        t.holder_running,
        true,
        Retention::Retain,
        now(),
    );
    run.status = Some(
        end.status
            .unwrap_or_else(|| panic!("the teardown's end wrote no status")),
    );
    run
}

fn running_long_lived() -> SandboxRun {
    reconciled(held(true), &view(true, WorkloadState::Running))
}

/// A run made from a template (`agent-tools`) that sets no command of its own, running: the
/// template's command, when it has one (recorded in `status.template` before the pod was
/// created), makes it a batch run; without one it is a long-lived sandbox (issue #53: the
/// health checks read only `spec.command` and called the templated batch run Healthy).
fn templated_running(template_command: bool) -> SandboxRun {
    let mut own = held(true);
    own.spec = SandboxRunSpec {
        template_ref: Some(crate::api::TemplateRef {
            kind: Default::default(),
            name: "agent-tools".into(),
        }),
        ..Default::default()
    };
    let template = crate::template::Fetched {
        spec: crate::api::SandboxRunTemplateSpec {
            template: applied(!template_command).spec,
            open_fields: Vec::new(),
        },
        generation: Some(1),
    };
    let made = crate::template::resolve(&own, Some(&template))
        .unwrap_or_else(|e| panic!("the template makes the run: {e}"));
    let status = reconciled(made, &view(true, WorkloadState::Running)).status;
    SandboxRun { status, ..own }
}

fn stopped_by_the_user() -> SandboxRun {
    let mut run = running_long_lived();
    run.spec.stop = true;
    run.metadata.generation = Some(2);
    run
}

fn past_its_deadline() -> SandboxRun {
    let mut run = reconciled(held(false), &view(true, WorkloadState::Running));
    run.spec.active_deadline_seconds = Some(30);
    run
}

fn refused() -> SandboxRun {
    let mut run = held(false);
    let message = "pods \"r-sbr\" is forbidden: exceeded quota: compute, requested: pods=1";
    run.status = plan::pod_refused(&run, message, now()).status;
    run
}

/// A run whose pod the kubelet cannot start: a ConfigMap it mounts is missing.
fn stuck() -> SandboxRun {
    let mut pod = view(false, WorkloadState::NotStarted);
    pod.problem = Some(PodProblem::Stuck {
        reason: "FailedMount",
        message: "MountVolume.SetUp failed for volume \"cfg\": configmap \"cfg\" not found".into(),
    });
    reconciled(held(false), &pod)
}

fn deleting() -> SandboxRun {
    let mut run = reconciled(held(false), &view(true, WorkloadState::Running));
    run.metadata.deletion_timestamp = Some(Time(now()));
    run
}

fn fixture(
    file: &'static str,
    argocd: &'static str,
    flux: &'static str,
    run: SandboxRun,
) -> Fixture {
    Fixture {
        file,
        argocd,
        flux,
        run,
    }
}

/// Every fixture: each verdict of both checks, and each moment of a run's life.
fn all() -> Vec<Fixture> {
    let running = view(true, WorkloadState::Running);
    let still_pending = view(false, WorkloadState::NotStarted);
    let sleeping_pod = pod_with_workload(
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        },
        None,
    );
    vec![
        fixture(
            "new-no-status.yaml",
            "Progressing",
            "InProgress",
            applied(false),
        ),
        fixture(
            "pending.yaml",
            "Progressing",
            "InProgress",
            reconciled(held(false), &still_pending),
        ),
        fixture("pending-pod-refused.yaml", "Degraded", "Failed", refused()),
        fixture("pending-pod-stuck.yaml", "Degraded", "Failed", stuck()),
        fixture(
            "running-batch.yaml",
            "Progressing",
            "InProgress",
            reconciled(held(false), &running),
        ),
        fixture(
            "running-long-lived.yaml",
            "Healthy",
            "Current",
            running_long_lived(),
        ),
        fixture(
            "running-templated-batch.yaml",
            "Progressing",
            "InProgress",
            templated_running(true),
        ),
        fixture(
            "running-templated-long-lived.yaml",
            "Healthy",
            "Current",
            templated_running(false),
        ),
        fixture(
            "stop-not-observed-yet.yaml",
            "Progressing",
            "InProgress",
            stopped_by_the_user(),
        ),
        fixture("deleting.yaml", "Progressing", "InProgress", deleting()),
        fixture(
            "draining.yaml",
            "Progressing",
            "InProgress",
            draining(held(false), &exited_pod(0)),
        ),
        fixture(
            "succeeded.yaml",
            "Healthy",
            "Current",
            ended(held(false), &exited_pod(0), ReadBackPhase::Drained),
        ),
        fixture(
            "failed-exit-code.yaml",
            "Degraded",
            "Failed",
            ended(held(false), &exited_pod(3), ReadBackPhase::Drained),
        ),
        fixture(
            "succeeded-but-drain-failed.yaml",
            "Degraded",
            "Failed",
            ended(held(false), &exited_pod(0), ReadBackPhase::Failed),
        ),
        fixture(
            "stopped.yaml",
            "Healthy",
            "Current",
            ended(stopped_by_the_user(), &sleeping_pod, ReadBackPhase::Drained),
        ),
        fixture(
            "stopped-by-deadline.yaml",
            "Degraded",
            "Failed",
            ended(past_its_deadline(), &sleeping_pod, ReadBackPhase::Drained),
        ),
    ]
}

/// A fixture's text: the verdicts line the test reads, where it comes from, the run as YAML.
fn text(f: &Fixture) -> String {
    let yaml = serde_yaml::to_string(&f.run).unwrap_or_else(|e| panic!("{}: {e}", f.file));
    format!(
        "# expect: argocd={} flux={}\n# GENERATED by hack/gen.sh from the operator's status builders \
         (src/controller/gitops_fixtures.rs). Never edited here.\n{yaml}",
        f.argocd, f.flux
    )
}

fn committed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gitops-fixtures")
}

fn yaml_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, text)
        })
        .collect()
}

#[test]
fn the_gitops_fixtures_are_what_the_status_builders_write() {
    let generated: BTreeMap<String, String> = all()
        .iter()
        .map(|f| (f.file.to_string(), text(f)))
        .collect();
    if let Some(dir) = std::env::var_os(WRITE_TO) {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, text) in &generated {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        return;
    }
    let committed = yaml_files(&committed_dir());
    let stale: Vec<&String> = generated
        .iter()
        .filter(|(name, text)| committed.get(*name) != Some(*text))
        .map(|(name, _)| name)
        .chain(
            committed
                .keys()
                .filter(|name| !generated.contains_key(*name)),
        )
        .collect();
    assert!(
        stale.is_empty(),
        "tests/gitops-fixtures is out of date with the status builders ({stale:?}): run `hack/gen.sh` and commit it"
    );
}

#[test]
fn each_fixture_shows_the_moment_it_is_named_for() {
    let by_file: BTreeMap<&str, SandboxRun> = all().into_iter().map(|f| (f.file, f.run)).collect();
    let phase = |file: &str| {
        by_file[file]
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(crate::api::Phase::as_str)
            .unwrap_or("none")
    };
    let want = [
        ("new-no-status.yaml", "none"),
        ("pending.yaml", "Pending"),
        ("pending-pod-refused.yaml", "Pending"),
        ("pending-pod-stuck.yaml", "Pending"),
        ("running-batch.yaml", "Running"),
        ("running-long-lived.yaml", "Running"),
        ("running-templated-batch.yaml", "Running"),
        ("running-templated-long-lived.yaml", "Running"),
        ("stop-not-observed-yet.yaml", "Running"),
        ("deleting.yaml", "Running"),
        ("draining.yaml", "Draining"),
        ("succeeded.yaml", "Succeeded"),
        ("failed-exit-code.yaml", "Failed"),
        ("succeeded-but-drain-failed.yaml", "Succeeded"),
        ("stopped.yaml", "Stopped"),
        ("stopped-by-deadline.yaml", "Stopped"),
    ];
    for (file, p) in want {
        assert_eq!(phase(file), p, "{file}");
    }
    assert_eq!(by_file.len(), want.len());
}

// ---- The health checks against the code, without a cluster or a Lua interpreter.

fn shipped(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Flux `healthCheckExprs` for SandboxRuns: (inProgress, failed, current).
fn flux_exprs() -> [String; 3] {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&shipped("deploy/gitops/flux-health-check-exprs.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
    let check = doc["healthCheckExprs"]
        .as_sequence()
        .and_then(|s| s.iter().find(|c| c["kind"].as_str() == Some("SandboxRun")))
        .unwrap_or_else(|| panic!("no SandboxRun entry"));
    ["inProgress", "failed", "current"].map(|k| {
        check[k]
            .as_str()
            .unwrap_or_else(|| panic!("no {k} expression"))
            .to_string()
    })
}

/// Flux's verdict on `run`, as tests/it/gitops.rs computes it: inProgress, failed, current in
/// that order, the first true wins; an evaluation error (no `status` yet) is waiting.
fn flux_verdict(exprs: &[String; 3], run: &SandboxRun) -> &'static str {
    let object = serde_json::to_value(run).unwrap_or_else(|e| panic!("{e}"));
    let mut ctx = cel_interpreter::Context::default();
    for (k, v) in object.as_object().into_iter().flatten() {
        ctx.add_variable(k.as_str(), v.clone())
            .unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    for (expr, verdict) in exprs.iter().zip(["InProgress", "Failed", "Current"]) {
        let program = cel_interpreter::Program::compile(expr)
            .unwrap_or_else(|e| panic!("{verdict} does not compile: {e}"));
        match program.execute(&ctx) {
            Ok(cel_interpreter::Value::Bool(true)) => return verdict,
            Ok(cel_interpreter::Value::Bool(false)) => {}
            Ok(other) => panic!("{verdict} is not a bool: {other:?}"),
            Err(_) => return "InProgress",
        }
    }
    "Unknown"
}

fn sorted(v: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = v.into_iter().collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn the_health_checks_name_exactly_the_reasons_a_run_cannot_start_with() {
    let code = sorted(
        crate::controller::run::status::cannot_start_reasons()
            .into_iter()
            .map(String::from),
    );
    // Argo CD: the `stuck` table of the Lua script.
    let lua = shipped("deploy/gitops/argocd-health.lua");
    let table = lua
        .lines()
        .find(|l| l.starts_with("local stuck = {"))
        .unwrap_or_else(|| panic!("no `local stuck = {{` table in argocd-health.lua"));
    let key = regex::Regex::new(r"(\w+) = true").unwrap_or_else(|e| panic!("{e}"));
    let argocd = sorted(key.captures_iter(table).map(|c| c[1].to_string()));
    assert_eq!(argocd, code, "argocd-health.lua's stuck table");
    // Flux: each `c.reason in [...]` list of the expressions.
    let list = regex::Regex::new(r"c\.reason in \[([^\]]*)\]").unwrap_or_else(|e| panic!("{e}"));
    let exprs = flux_exprs();
    let lists: Vec<Vec<String>> = exprs
        .iter()
        .flat_map(|e| {
            list.captures_iter(e)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .map(|l| {
            sorted(
                l.split(',')
                    .map(|r| r.trim().trim_matches('\'').to_string()),
            )
        })
        .collect();
    assert_eq!(
        lists.len(),
        2,
        "inProgress and failed each list the reasons"
    );
    for l in lists {
        assert_eq!(l, code, "a Flux expression's reason list");
    }
}

#[test]
fn flux_calls_a_pending_run_failed_exactly_when_the_code_says_it_cannot_start() {
    let exprs = flux_exprs();
    for reason in crate::controller::run::status::cannot_start_reasons() {
        let mut run = held(false);
        run.status = Some(crate::controller::run::status::pending_status(
            &run,
            reason,
            "why",
            now(),
        ));
        assert_eq!(flux_verdict(&exprs, &run), "Failed", "{reason}");
    }
    for reason in [
        crate::controller::conditions::REASON_POD_PENDING,
        crate::controller::conditions::REASON_POD_CREATED,
    ] {
        let mut run = held(false);
        run.status = Some(crate::controller::run::status::pending_status(
            &run,
            reason,
            "starting",
            now(),
        ));
        assert_eq!(flux_verdict(&exprs, &run), "InProgress", "{reason}");
    }
}

#[test]
fn flux_gives_every_generated_fixture_its_expected_verdict() {
    let exprs = flux_exprs();
    let wrong: Vec<String> = all()
        .iter()
        .filter_map(|f| {
            let got = flux_verdict(&exprs, &f.run);
            (got != f.flux).then(|| format!("{}: Flux {got}, expected {}", f.file, f.flux))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_pod_problem_is_a_reason_the_health_checks_know() {
    use crate::controller::pod_view::{STUCK_CONTAINER_REASONS, STUCK_EVENT_REASONS};
    let reasons = crate::controller::run::status::cannot_start_reasons();
    let mut problems = vec![
        PodProblem::Unschedulable(String::new()),
        PodProblem::ImagePull {
            fatal: false,
            message: String::new(),
        },
        PodProblem::EgressGate(String::new()),
    ];
    problems.extend(
        STUCK_CONTAINER_REASONS
            .iter()
            .chain(STUCK_EVENT_REASONS)
            .map(|reason| PodProblem::Stuck {
                reason,
                message: String::new(),
            }),
    );
    for p in &problems {
        // A new kind of problem fails to compile here until it is listed above.
        match p {
            PodProblem::Unschedulable(_)
            | PodProblem::ImagePull { .. }
            | PodProblem::Stuck { .. }
            | PodProblem::EgressGate(_) => {}
        }
        assert!(reasons.contains(&p.reason()), "{p:?}");
    }
}
