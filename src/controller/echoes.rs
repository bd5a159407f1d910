//! Echoes: the watch events that only repeat what a reconcile of this replica already saw
//! (docs/contract.md "A watch event that repeats what was seen wakes nothing"). Each of a run's
//! own writes (its finalizer, its status), the pod it creates, and the pod changes that no
//! decision reads (its binding to a node, its passing conditions) comes back as a watch event;
//! each woke the run for a reconcile that read its pod again and decided what the last one had.
//! Remembered here, per replica and in memory only (a restart forgets them: every event wakes
//! again):
//! - the run versions a reconcile started from (`resourceVersion`, which names one stored
//!   object): an event carrying one of them is dropped;
//! - of each run pod, the digest of what decisions read of it
//!   ([`crate::controller::pod_view::pod_digest`]) as a reconcile last read it or as its creation
//!   returned it: an event whose pod has the same digest is dropped. A pod's deletion always wakes.
//! - the run a write of this reconcile returned, so the reconcile can go on from it at once
//!   (`super::run::pipeline`), instead of waiting for its echo.
//!
//! Dropping such an event is safe because what it carries was the input of a decision already
//! made: the pod, the time and the run's other objects wake the run through their own events and
//! requeues.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use crate::api::SandboxRun;
use crate::controller::pod_view::pod_digest;

/// Past this many entries a map is emptied: forgetting only lets events through again.
const REMEMBERED: usize = 50_000;
/// Past this many reconciles awaiting their write's run (one a reconcile worker, each taken
/// when its reconcile ends; left only by a reconcile that failed after its write), all are
/// dropped: those reconciles wait for the write's echo instead.
const WRITES_AWAITED: usize = 1_024;

/// What this replica's reconciles saw, for the watch filters.
#[derive(Default)]
pub(crate) struct Echoes {
    /// Run uid → the resourceVersion a reconcile last started from.
    runs: Mutex<HashMap<String, String>>,
    /// Pod uid → the digest of the pod as last read or created.
    pods: Mutex<HashMap<String, u64>>,
    /// Run uid → the resourceVersion a reconcile holds and will go on from a write over, and
    /// the run that write returned, once made. Only while that reconcile runs.
    written: Mutex<HashMap<String, (String, Option<Arc<SandboxRun>>)>>,
}

impl Echoes {
    /// A reconcile starts from `run`.
    pub(crate) fn saw_run(&self, run: &SandboxRun) {
        let (Some(uid), Some(rv)) = (
            run.metadata.uid.as_ref(),
            run.metadata.resource_version.as_ref(),
        ) else {
            return;
        };
        if let Ok(mut runs) = self.runs.lock() {
            if runs.len() >= REMEMBERED {
                runs.clear();
            }
            runs.insert(uid.clone(), rv.clone());
        }
    }

    /// Whether a watch event carrying `run` repeats a version a reconcile already started from.
    pub(crate) fn repeats_run(&self, run: &SandboxRun) -> bool {
        let (Some(uid), Some(rv)) = (
            run.metadata.uid.as_ref(),
            run.metadata.resource_version.as_ref(),
        ) else {
            return false;
        };
        self.runs
            .lock()
            .is_ok_and(|runs| runs.get(uid).is_some_and(|seen| seen == rv))
    }

    /// The run is gone: nothing of it is remembered.
    pub(crate) fn forget_run(&self, run: &SandboxRun) {
        let Some(uid) = run.metadata.uid.as_deref() else {
            return;
        };
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(uid);
        }
        if let Ok(mut written) = self.written.lock() {
            written.remove(uid);
        }
    }

    /// A reconcile read `pod` (or its creation returned it).
    pub(crate) fn saw_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_ref() else {
            return;
        };
        let digest = pod_digest(pod);
        if let Ok(mut pods) = self.pods.lock() {
            if pods.len() >= REMEMBERED {
                pods.clear();
            }
            pods.insert(uid.clone(), digest);
        }
    }

    /// Whether a watch event carrying `pod` (changed or added, not deleted) repeats what a
    /// reconcile last read of it.
    pub(crate) fn repeats_pod(&self, pod: &Pod) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        let digest = pod_digest(pod);
        self.pods
            .lock()
            .is_ok_and(|pods| pods.get(uid).is_some_and(|seen| *seen == digest))
    }

    /// The pod is gone.
    pub(crate) fn forget_pod(&self, pod: &Pod) {
        if let (Some(uid), Ok(mut pods)) = (pod.metadata.uid.as_deref(), self.pods.lock()) {
            pods.remove(uid);
        }
    }

    /// A reconcile holding `run` will go on from what a write of its over `run` returns
    /// ([`Echoes::take_written`]).
    pub(crate) fn expect_write(&self, run: &SandboxRun) {
        let (Some(uid), Some(rv)) = (
            run.metadata.uid.clone(),
            run.metadata.resource_version.clone(),
        ) else {
            return;
        };
        if let Ok(mut written) = self.written.lock() {
            if written.len() >= WRITES_AWAITED {
                written.clear();
            }
            written.insert(uid, (rv, None));
        }
    }

    /// A write over `over` (the run as it was written over) returned `after`: kept when a
    /// reconcile holding `over` awaits it.
    pub(crate) fn wrote_run(&self, over: &SandboxRun, after: SandboxRun) {
        let (Some(uid), Some(rv)) = (
            over.metadata.uid.as_deref(),
            over.metadata.resource_version.as_deref(),
        ) else {
            return;
        };
        if after.metadata.uid.as_deref() != Some(uid) {
            return;
        }
        let Ok(mut written) = self.written.lock() else {
            return;
        };
        if let Some((awaited, made)) = written.get_mut(uid) {
            if awaited == rv {
                let mut after = after;
                after.metadata.managed_fields = None;
                *made = Some(Arc::new(after));
            }
        }
    }

    /// The run a write over exactly `run` returned, taken; the wait for it ends either way
    /// (None: nothing was written over it).
    pub(crate) fn take_written(&self, run: &SandboxRun) -> Option<Arc<SandboxRun>> {
        let uid = run.metadata.uid.as_deref()?;
        let rv = run.metadata.resource_version.as_deref()?;
        let mut written = self.written.lock().ok()?;
        match written.remove(uid) {
            Some((over, made)) if over == rv => made,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};

    fn run(uid: &str, rv: &str) -> SandboxRun {
        let mut run = SandboxRun::new("r", Default::default());
        run.metadata.uid = Some(uid.into());
        run.metadata.resource_version = Some(rv.into());
        run
    }

    fn pod(uid: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("r-pod".into()),
                uid: Some(uid.into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_run_version_a_reconcile_started_from_is_an_echo_and_a_newer_one_is_not() {
        let echoes = Echoes::default();
        assert!(!echoes.repeats_run(&run("u", "5")));
        echoes.saw_run(&run("u", "5"));
        assert!(echoes.repeats_run(&run("u", "5")));
        assert!(!echoes.repeats_run(&run("u", "6")));
        assert!(!echoes.repeats_run(&run("other", "5")));
        echoes.forget_run(&run("u", "5"));
        assert!(!echoes.repeats_run(&run("u", "5")));
    }

    #[test]
    fn a_pods_binding_repeats_what_was_read_and_its_start_does_not() {
        let echoes = Echoes::default();
        let created = pod("p");
        echoes.saw_pod(&created);
        // The scheduler binds it: a node, PodScheduled=True, a new resourceVersion.
        let mut bound = created.clone();
        bound.metadata.resource_version = Some("2".into());
        bound.spec.as_mut().unwrap().node_name = Some("n".into());
        bound.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        assert!(echoes.repeats_pod(&bound));
        // Its workload runs: a decision reads that.
        let mut running = bound.clone();
        let status = running.status.as_mut().unwrap();
        status.phase = Some("Running".into());
        status.container_statuses = Some(vec![ContainerStatus {
            name: crate::pod::WORKLOAD_CONTAINER.into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(!echoes.repeats_pod(&running));
        // Ready, as Kueue's waitForPodsReady counts it: read too.
        let mut ready = bound.clone();
        ready.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        assert!(!echoes.repeats_pod(&ready));
        // Relabelled or annotated (a seal, a launcher's record): read too.
        let mut annotated = bound.clone();
        annotated.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert!(!echoes.repeats_pod(&annotated));
        echoes.forget_pod(&created);
        assert!(!echoes.repeats_pod(&bound));
    }

    #[test]
    fn only_a_write_over_the_version_a_reconcile_holds_is_taken() {
        let echoes = Echoes::default();
        // Nobody awaits it (a drain's write): not kept.
        echoes.wrote_run(&run("u", "5"), run("u", "6"));
        assert!(echoes.take_written(&run("u", "5")).is_none());
        echoes.expect_write(&run("u", "5"));
        echoes.wrote_run(&run("u", "4"), run("u", "6"));
        echoes.wrote_run(&run("u", "5"), run("u", "6"));
        assert!(echoes.take_written(&run("u", "4")).is_none());
        echoes.expect_write(&run("u", "5"));
        echoes.wrote_run(&run("u", "5"), run("u", "6"));
        let taken = echoes.take_written(&run("u", "5"));
        assert_eq!(
            taken.and_then(|r| r.metadata.resource_version.clone()),
            Some("6".to_string())
        );
        assert!(echoes.take_written(&run("u", "5")).is_none());
        // A response naming another run is never taken for this one.
        echoes.expect_write(&run("u", "5"));
        echoes.wrote_run(&run("u", "5"), run("v", "6"));
        assert!(echoes.take_written(&run("u", "5")).is_none());
    }
}
