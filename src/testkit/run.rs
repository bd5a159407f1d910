//! A `SandboxRun` as a test describes it: [`sandbox_run`] names it, each method adds one fact
//! (its namespace, uid, labels, spec fields, status), [`RunBuilder::build`] makes it. Nothing is
//! set that the test does not say: no namespace, uid, spec field or status by default.
//!
//! This file names the API as `super::api` and nothing else of the crate: the unit tests reach it
//! as `crate::testkit`, the integration tests include it as it is (their `super::api` is the
//! crate's public `api`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::api::{
    NetworkMode, NetworkPolicy, Phase, ReadBack, ReadBackPath, SandboxRun, SandboxRunSpec,
    SandboxRunStatus,
};

/// A run being built: see [`sandbox_run`].
#[derive(Clone, Debug)]
pub struct RunBuilder(SandboxRun);

/// The run `name`, with an empty spec and nothing else.
pub fn sandbox_run(name: &str) -> RunBuilder {
    RunBuilder(SandboxRun::new(name, SandboxRunSpec::default()))
}

impl RunBuilder {
    /// `metadata.namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    /// `metadata.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    /// `metadata.generation`.
    pub fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(mut self, version: &str) -> Self {
        self.0.metadata.resource_version = Some(version.into());
        self
    }

    /// `metadata.creationTimestamp`.
    pub fn created(mut self, at: jiff::Timestamp) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }

    /// The label `key=value` (beside the ones set before).
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// `metadata.finalizers`.
    pub fn finalizers(mut self, finalizers: &[&str]) -> Self {
        self.0.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        self
    }

    /// The whole spec, replacing what was said of it before.
    pub fn spec(mut self, spec: SandboxRunSpec) -> Self {
        self.0.spec = spec;
        self
    }

    /// Changes the spec as `edit` says (for a field no method covers).
    pub fn edit(mut self, edit: impl FnOnce(&mut SandboxRunSpec)) -> Self {
        edit(&mut self.0.spec);
        self
    }

    /// `spec.network`: `mode` with `rules`.
    pub fn network(self, mode: NetworkMode, rules: &[&str]) -> Self {
        self.edit(|spec| {
            spec.network = Some(NetworkPolicy {
                mode,
                rules: rules.iter().map(|r| r.to_string()).collect(),
            })
        })
    }

    /// `spec.readBack` declaring `paths`, none of them required, every other field defaulted.
    pub fn read_back(self, paths: &[&str]) -> Self {
        let paths: Vec<(&str, bool)> = paths.iter().map(|p| (*p, false)).collect();
        self.read_back_required(&paths)
    }

    /// `spec.readBack` declaring each `(path, required)`, every other field defaulted.
    pub fn read_back_required(self, paths: &[(&str, bool)]) -> Self {
        self.edit(|spec| {
            spec.read_back = Some(ReadBack {
                paths: paths
                    .iter()
                    .map(|(path, required)| ReadBackPath {
                        path: path.to_string(),
                        required: *required,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        })
    }

    /// The whole status, replacing what was said of it before.
    pub fn status(mut self, status: SandboxRunStatus) -> Self {
        self.0.status = Some(status);
        self
    }

    /// `status.phase` (a status is made if there was none).
    pub fn phase(mut self, phase: Option<Phase>) -> Self {
        self.0.status.get_or_insert_with(Default::default).phase = phase;
        self
    }

    /// `status.podName` (a status is made if there was none).
    pub fn pod_name(mut self, pod: &str) -> Self {
        self.0.status.get_or_insert_with(Default::default).pod_name = Some(pod.into());
        self
    }

    /// The run.
    pub fn build(self) -> SandboxRun {
        self.0
    }
}

impl From<RunBuilder> for SandboxRun {
    fn from(run: RunBuilder) -> SandboxRun {
        run.0
    }
}
