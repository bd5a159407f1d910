//! SandboxRuns as the tests write them: a spec builder with the defaults most tests share, and
//! the steps every lifecycle test takes (create, end the workload).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use sandboxrun_operator::api::{
    Compression, NetworkMode, NetworkPolicy, Phase, ReadBack, ReadBackPath, ReadBackStatus,
    Retention, SandboxRun, SandboxRunSpec,
};
use serde_json::json;

use super::operator::Operator;
use super::wait::{eventually_or_log, wait_phase};

/// An image pinned by digest, so admission and the pod builder never try to resolve a tag.
pub const DIGEST_IMAGE: &str =
    "registry.example/tool@sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// An image by tag, as users write it (a test with the webhook's image check off).
pub const TAGGED_IMAGE: &str = "registry.example/tool:1";

/// The annotation the kwok node reads as the workload's exit code (hack/kwok/sandboxrun-stages.yaml): setting it ends
/// the workload container.
pub const TEST_EXIT_CODE_ANNOTATION: &str = "sandbox.iterion.io/test-exit-code";

/// A SandboxRun spec being built: see [`spec`].
#[derive(Clone, Debug)]
pub struct Spec(SandboxRunSpec);

/// A batch run (`sh -c work`, user `1000:1000`, [`DIGEST_IMAGE`]) that reads `paths` back with a
/// 60 s drain timeout, no size limit and no compression; each method changes one of those.
pub fn spec(paths: &[&Path]) -> Spec {
    Spec(SandboxRunSpec {
        image: Some(DIGEST_IMAGE.into()),
        command: Some(vec!["sh".into(), "-c".into(), "work".into()]),
        user: Some("1000:1000".into()),
        read_back: Some(ReadBack {
            paths: paths
                .iter()
                .map(|p| ReadBackPath {
                    path: p.display().to_string(),
                    ..Default::default()
                })
                .collect(),
            drain_timeout: Some("60s".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

impl Spec {
    fn read_back_mut(&mut self) -> &mut ReadBack {
        self.0.read_back.get_or_insert_with(ReadBack::default)
    }

    /// The workload image.
    pub fn image(mut self, image: &str) -> Spec {
        self.0.image = Some(image.into());
        self
    }

    /// The workload's argv; `None` is a long-lived sandbox (the image's own command).
    pub fn command(mut self, argv: Option<&[&str]>) -> Spec {
        self.0.command = argv.map(|a| a.iter().map(|s| s.to_string()).collect());
        self
    }

    /// The workload is `sh -c script`.
    pub fn sh(self, script: &str) -> Spec {
        self.command(Some(&["sh", "-c", script]))
    }

    /// `spec.user`.
    pub fn user(mut self, user: &str) -> Spec {
        self.0.user = Some(user.into());
        self
    }

    /// `readBack.drainTimeout`.
    pub fn drain_timeout(mut self, timeout: &str) -> Spec {
        self.read_back_mut().drain_timeout = Some(timeout.into());
        self
    }

    /// `sizeLimit` of every path.
    pub fn size_limit(mut self, limit: &str) -> Spec {
        for p in &mut self.read_back_mut().paths {
            p.size_limit = Some(Quantity(limit.to_string()));
        }
        self
    }

    /// `sizeLimit` of the `i`th path only.
    pub fn size_limit_of(mut self, i: usize, limit: &str) -> Spec {
        self.read_back_mut().paths[i].size_limit = Some(Quantity(limit.to_string()));
        self
    }

    /// `readBack.compression`.
    pub fn compression(mut self, compression: Compression) -> Spec {
        self.read_back_mut().compression = compression;
        self
    }

    /// `readBack.retention`.
    pub fn retention(mut self, retention: Option<Retention>) -> Spec {
        self.read_back_mut().retention = retention;
        self
    }

    /// `spec.network`: the egress mode and its rules.
    pub fn network(mut self, mode: NetworkMode, rules: &[&str]) -> Spec {
        self.0.network = Some(NetworkPolicy {
            mode,
            rules: rules.iter().map(|r| r.to_string()).collect(),
        });
        self
    }

    /// The spec, for a test that sets a field no method covers.
    pub fn build(self) -> SandboxRunSpec {
        self.0
    }
}

impl From<Spec> for SandboxRunSpec {
    fn from(spec: Spec) -> SandboxRunSpec {
        spec.0
    }
}

/// Creates the run `name` (panics when the apiserver refuses it).
pub async fn create(
    runs: &Api<SandboxRun>,
    name: &str,
    spec: impl Into<SandboxRunSpec>,
) -> SandboxRun {
    runs.create(&PostParams::default(), &SandboxRun::new(name, spec.into()))
        .await
        .unwrap_or_else(|e| panic!("create SandboxRun {name}: {e}"))
}

/// [`create`], for the first run after a release is installed: while the apiserver cannot call
/// the release's webhook yet (its pod ready, its Service's endpoint not programmed on the node:
/// "failed calling webhook … connection refused"), the create is tried again, for up to 60 s.
/// Any other refusal panics at once.
pub async fn create_once_webhook_answers(
    runs: &Api<SandboxRun>,
    name: &str,
    spec: impl Into<SandboxRunSpec>,
) -> SandboxRun {
    let run = SandboxRun::new(name, spec.into());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match runs.create(&PostParams::default(), &run).await {
            Ok(created) => return created,
            Err(kube::Error::Api(e))
                if e.message.contains("failed calling webhook")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => panic!("create SandboxRun {name}: {e}"),
        }
    }
}

/// The name of the run's pod, from its status (panics when the status names none yet).
pub fn pod_of(run: &SandboxRun) -> String {
    run.status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .unwrap_or_else(|| panic!("the status of {:?} names no pod", run.metadata.name))
}

/// The pod of the run `run` (by the name the operator gives it), once it exists (fails after 60 s
/// with the operator's log).
pub async fn wait_for_pod(pods: &Api<Pod>, run: &str, op: &Operator) -> Pod {
    let name = sandboxrun_operator::pod::pod_name(run);
    eventually_or_log(&format!("pod {name}"), Duration::from_secs(60), op, || {
        let pods = pods.clone();
        let name = name.clone();
        async move { pods.get_opt(&name).await.ok().flatten() }
    })
    .await
}

/// Ends the workload of the pod `pod` with exit code `code` (teardown begins).
pub async fn finish_workload(pods: &Api<Pod>, pod: &str, code: i32) {
    let patch = json!({"metadata": {"annotations": {TEST_EXIT_CODE_ANNOTATION: code.to_string()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("end the workload of {pod}: {e}"));
}

/// The `i`th read-back entry of the run's status.
pub fn read_back(run: &SandboxRun, i: usize) -> ReadBackStatus {
    run.status.as_ref().expect("status").read_back[i].clone()
}

/// Waits until the run `name` is Running, then ends its workload with exit code 0 (teardown
/// begins).
pub async fn run_then_finish(runs: &Api<SandboxRun>, pods: &Api<Pod>, name: &str, op: &Operator) {
    let run = wait_phase(runs, name, Phase::Running, op).await;
    finish_workload(pods, &pod_of(&run), 0).await;
}
