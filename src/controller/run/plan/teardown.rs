//! Planning a teardown: its opening, each owed path's work (drain, or an outcome already
//! known), the progress of its drains ([`TeardownProgress`], docs/contract.md "A quiet
//! lifecycle") and its end.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::super::decide::Trigger;
use super::super::retention::{self};
use super::super::status::{
    draining_status, ensure_pending_entries, finished_status, never_started_entry,
};
use super::model::{Effect, Plan, Requeue};
use crate::api::{Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRun, SandboxRunStatus};
use crate::caps::CapSettings;
use crate::controller::conditions::{self};
use crate::controller::events::{self, drain_summary, teardown_event, PlannedEvent};
use crate::controller::pod_view::{workload_termination, PodView, WorkloadState};
use crate::pod::{ReadBackSlot, SlotMismatch};

/// What a teardown does before and during its drains.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TeardownPlan {
    /// The opening: its Event (not when resumed) and the Draining status, written when the
    /// teardown begins or a resumed one learned how the workload ended.
    pub opening: Plan,
    /// Whether the opening waits [`SETTLE`]: a teardown that begins with a Normal Event is
    /// reported `Draining` only if its paths have not all drained by then (the opening is then
    /// written with the outcomes had so far); a Warning (a failed image pull) is told at once.
    pub opening_waits: bool,
    /// The status the drains record their outcomes in.
    pub status: SandboxRunStatus,
    /// Time left for the drains: the deadline runs from the start of teardown (the
    /// Drained=Unknown transition), so a restart mid-drain does not grant a fresh timeout.
    pub drain_left: Duration,
    /// The paths still owed an outcome, in declaration order.
    pub paths: Vec<PathPlan>,
    /// The holder container runs (so the drains can exec into it).
    pub holder_running: bool,
}

/// One path a teardown owes an outcome.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PathPlan {
    /// Its entry in `status.readBack`.
    pub entry: usize,
    /// Its index among the declared paths (its object keys).
    pub index: usize,
    /// The declared path.
    pub path: String,
    /// How its outcome is had.
    pub work: PathWork,
}

/// How a path's outcome is had.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PathWork {
    /// Known without draining: record it.
    Record(ReadBackStatus),
    /// Drain it from the holder.
    Drain {
        /// Its cap (the path's `sizeLimit` within the operator's caps).
        cap_bytes: u64,
        /// Attempts already made (a resumed teardown).
        previous_attempts: u32,
        /// Where the holder mounts the path: the packer's argument (the pod's read-back slot read
        /// back, so a pod built by an older operator is drained where its holder sees the path).
        holder_path: String,
    },
}

/// `paths` when the run's store cannot be used (`why` names it): every path still to drain is
/// recorded Failed, naming the store, nothing read from the pod — never a fallback to another
/// store (docs/contract.md "A store per namespace").
pub(crate) fn without_store(paths: Vec<PathPlan>, why: &str) -> Vec<PathPlan> {
    paths
        .into_iter()
        .map(|path| match path.work {
            PathWork::Drain {
                previous_attempts, ..
            } => PathPlan {
                work: PathWork::Record(crate::drain::path_drain::store_unusable(
                    &path.path,
                    previous_attempts,
                    why,
                )),
                ..path
            },
            PathWork::Record(_) => path,
        })
        .collect()
}

/// The start of the outcome of a path whose pod does not serve its read-back slot.
pub(crate) const NOT_SERVED: &str =
    "the pod does not serve this read-back path as the operator built it, so it is not read";
/// The message of a path that cannot be drained because the holder is not running.
pub(crate) const HOLDER_NOT_RUNNING: &str = "the holder container is not running, so the path cannot be read (exec into a stopped container is impossible)";

/// Plans a teardown begun (or resumed) at `now` with `trigger`, for the run's `pod` (None: gone).
/// Each path still Pending gets its outcome from what is known: a workload that never started
/// wrote nothing (`Empty`), a holder that is not running cannot be read (`Failed`), else the path
/// is drained within `drain_timeout_seconds` of the teardown's start.
pub(crate) fn teardown(
    run: &SandboxRun,
    pod: Option<&Pod>,
    trigger: &Trigger,
    caps: &CapSettings,
    drain_timeout_seconds: i64,
    now: Timestamp,
) -> TeardownPlan {
    // Read before the pod is deleted: the evidence must outlive it.
    let workload = pod.and_then(workload_termination);
    let (status, opening, opening_waits) =
        if run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Draining) {
            // A teardown resumed after a restart, or begun before the workload exited.
            let mut s = run.status.clone().unwrap_or_default();
            ensure_pending_entries(run, &mut s);
            let learned = s.workload.is_none() && workload.is_some();
            if learned {
                s.workload = workload;
            }
            let opening = Plan {
                status: learned.then(|| s.clone()),
                ..Plan::wait(Requeue::AwaitChange)
            };
            (s, opening, false)
        } else {
            let s = draining_status(run, trigger, workload, now);
            let (warning, reason, note) = teardown_event(trigger);
            let event = PlannedEvent {
                warning,
                reason,
                note,
                action: "Teardown",
                about_pod: true,
            };
            let opening = Plan {
                events: vec![event],
                status: Some(s.clone()),
                ..Plan::wait(Requeue::AwaitChange)
            };
            (s, opening, !warning)
        };
    let began = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::DRAINED && c.status == "Unknown")
        .map(|c| c.last_transition_time.0)
        .unwrap_or(now);
    let left = jiff::SignedDuration::from_secs(drain_timeout_seconds)
        .checked_sub(now.duration_since(began))
        .unwrap_or_default();
    let drain_left = Duration::try_from(left).unwrap_or(Duration::ZERO);

    let view = pod.map(PodView::of);
    let holder_running = view.as_ref().is_some_and(|v| v.holder_running);
    let never_started = view
        .as_ref()
        .is_none_or(|v| v.workload == WorkloadState::NotStarted)
        && status.start_time.is_none();
    let holder = holder_running.then_some(pod).flatten();
    let paths = owed_paths(run, &status, trigger, never_started, holder, caps);
    TeardownPlan {
        opening,
        opening_waits,
        status,
        drain_left,
        paths,
        holder_running,
    }
}

/// The paths of `status` still Pending, each with how its outcome is had: a workload that never
/// started wrote nothing (`Empty`), a holder that is not running cannot be read (`Failed`), else
/// the path is drained within its cap. `running_holder` is the pod when its holder runs.
pub(super) fn owed_paths(
    run: &SandboxRun,
    status: &SandboxRunStatus,
    trigger: &Trigger,
    never_started: bool,
    running_holder: Option<&Pod>,
    caps: &CapSettings,
) -> Vec<PathPlan> {
    let mut paths = Vec::new();
    for (index, declared) in run.spec.read_back_paths().iter().enumerate() {
        let Some(entry) = status
            .read_back
            .iter()
            .position(|e| e.path == declared.path)
        else {
            continue;
        };
        if status.read_back[entry].phase != ReadBackPhase::Pending {
            continue;
        }
        let work = match running_holder {
            _ if never_started => PathWork::Record(never_started_entry(&declared.path, trigger)),
            None => PathWork::Record(ReadBackStatus {
                path: declared.path.clone(),
                phase: ReadBackPhase::Failed,
                message: Some(HOLDER_NOT_RUNNING.to_string()),
                ..Default::default()
            }),
            Some(pod) => {
                let requested = declared
                    .size_limit
                    .as_ref()
                    .and_then(|q| crate::units::quantity_to_bytes(q).ok());
                let cap_bytes = caps.effective(requested);
                let previous_attempts = status.read_back[entry].attempts;
                drain_in_slot(pod, (index, &declared.path), cap_bytes, previous_attempts)
            }
        };
        paths.push(PathPlan {
            entry,
            index,
            path: declared.path.clone(),
            work,
        });
    }
    paths
}

/// Path `index` drained from `pod`'s holder where the pod serves its slot ([`ReadBackSlot::read`],
/// docs/contract.md "A read-back slot is made once"); a pod whose mounts are not the slot's is
/// never read: the path is recorded Failed, saying why ([`not_served`]).
pub(crate) fn drain_in_slot(
    pod: &Pod,
    (index, path): (usize, &str),
    cap_bytes: u64,
    previous_attempts: u32,
) -> PathWork {
    match ReadBackSlot::read(pod, index, path) {
        Ok(slot) => PathWork::Drain {
            cap_bytes,
            previous_attempts,
            holder_path: slot.holder_mount,
        },
        Err(mismatch) => PathWork::Record(not_served(path, &mismatch)),
    }
}

/// The outcome of `path`, which the pod does not serve as its slot (`mismatch`): Failed, never
/// read.
pub(crate) fn not_served(path: &str, mismatch: &SlotMismatch) -> ReadBackStatus {
    ReadBackStatus {
        path: path.to_string(),
        phase: ReadBackPhase::Failed,
        message: Some(format!("{NOT_SERVED}: {mismatch}")),
        ..Default::default()
    }
}

/// The end of a teardown once every path has an outcome in `status`: ONE Event for every path
/// (the Recorder folds Events with the same reason into a series that shows only the first note,
/// so one Event per path hid all but one, issue #17), the final status and the Event announcing
/// it (a Warning whenever the run ended badly, Failed=True, whatever its phase); then the holder
/// is told the drain is done, the pod deleted at once, and a deleted run released (with
/// retention Delete, after its stored files are deleted; a delete that fails is retried by the
/// next reconciles, [`Step::ReleaseFinalizer`]).
pub(crate) fn teardown_end(
    run: &SandboxRun,
    status: SandboxRunStatus,
    holder_running: bool,
    pod_exists: bool,
    default_retention: Retention,
    now: Timestamp,
) -> Plan {
    // A drain with a failed or capped path has its own Warning (the contract's reasons), as has
    // one that stored changed files (`ReadBackChanged`); a clean one is told in the Event that
    // announces the end, one Event for the whole teardown.
    let summary = drain_summary(&status.read_back);
    let status = finished_status(run, status, now);
    let mut note = status.message.clone().unwrap_or_default();
    let mut events = Vec::new();
    match summary {
        Some(s) if s.warning => events.push(s.into_event("Drain").about_pod()),
        Some(s) => note = format!("{note}. {}", s.note),
        None => {}
    }
    let (warning, reason) = events::ending_event(&status);
    events.push(PlannedEvent {
        warning,
        reason,
        note,
        action: "Teardown",
        about_pod: true,
    });
    let mut effects = Vec::new();
    if holder_running {
        effects.push(Effect::MarkDrained);
    }
    if pod_exists {
        effects.push(Effect::DeletePod { at_once: true });
    }
    if run.metadata.deletion_timestamp.is_some() {
        if retention::retention(run, default_retention) == Retention::Delete {
            effects.push(Effect::PurgeStoredFiles);
        }
        effects.push(Effect::RemoveFinalizer);
    }
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// A teardown as its drains report (docs/contract.md "A quiet lifecycle"): what to write, and
/// when. The opening is written when the teardown begins, or, when it waits the quiet window,
/// once the window has passed with paths still draining (with the outcomes had by then); once
/// it is written each outcome is written as it is had, but the last, which goes with the end. A
/// drain that reports no outcome means this replica stops draining (lost lease, shutdown):
/// nothing more is recorded, so the next leader resumes from the store's commit point.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TeardownProgress {
    status: SandboxRunStatus,
    opening: Option<Plan>,
    owed: usize,
    stopped: bool,
}

impl TeardownProgress {
    /// The progress of `planned`'s drains, and the opening to write now (None: it waits out
    /// `settle`).
    pub(crate) fn begin(
        opening: Plan,
        opening_waits: bool,
        status: SandboxRunStatus,
        owed: usize,
        settle: Duration,
    ) -> (TeardownProgress, Option<Plan>) {
        let waits = opening_waits && !settle.is_zero();
        let progress = TeardownProgress {
            status,
            opening: None,
            owed,
            stopped: false,
        };
        if waits {
            (
                TeardownProgress {
                    opening: Some(opening),
                    ..progress
                },
                None,
            )
        } else {
            (progress, Some(opening))
        }
    }

    /// Whether the quiet window still matters: the opening is unwritten and draining goes on.
    pub(crate) fn waits_for_quiet_window(&self) -> bool {
        self.opening.is_some() && !self.stopped
    }

    /// The quiet window passed with paths still draining: the opening to write now, with the
    /// outcomes had so far.
    pub(crate) fn quiet_window_passed(&mut self) -> Option<Plan> {
        if self.stopped {
            return None;
        }
        let mut late = self.opening.take()?;
        late.status = Some(self.status.clone());
        Some(late)
    }

    /// One path's drain ended with `outcome` for status entry `entry` (None: this replica stops
    /// draining). Returns the status to write now, if any.
    pub(crate) fn outcome(
        &mut self,
        entry: usize,
        outcome: Option<ReadBackStatus>,
    ) -> Option<SandboxRunStatus> {
        self.owed = self.owed.saturating_sub(1);
        match outcome {
            Some(outcome) if !self.stopped => {
                if let Some(slot) = self.status.read_back.get_mut(entry) {
                    *slot = outcome;
                }
                (self.opening.is_none() && self.owed > 0).then(|| self.status.clone())
            }
            _ => {
                self.stopped = true;
                None
            }
        }
    }

    /// Every drain reported: the status the end is planned from ([`teardown_end`]); None when
    /// this replica stopped draining.
    pub(crate) fn finish(self) -> Option<SandboxRunStatus> {
        (!self.stopped).then_some(self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ReadBackPhase, ReadBackStatus, Retention, SandboxRunStatus};
    use crate::controller::conditions;
    use crate::controller::conditions::set_condition_unknown;
    use crate::controller::events;
    use crate::controller::run::decide::Trigger;
    use crate::controller::testkit::fixtures::*;

    use crate::controller::run::plan::testing::*;
    use crate::controller::run::plan::*;

    use std::time::Duration;

    #[test]
    fn a_store_that_cannot_be_used_fails_every_path_still_to_drain_naming_it() {
        let caps = CapSettings::default();
        let mut r = with_phase(
            run_with(&[("/out", false), ("/logs", false)]),
            Phase::Running,
        );
        r.spec.stop = true;
        let pod = with_slots(a_pod(true, true), &r);
        let mut paths = teardown(&r, Some(&pod), &Trigger::Stop, &caps, 300, now()).paths;
        let known = crate::drain::path_drain::store_unusable("/logs", 0, "earlier");
        paths[1].work = PathWork::Record(known.clone());
        let paths = without_store(paths, "no Secret tenant-store-key");
        let PathWork::Record(failed) = &paths[0].work else {
            panic!("{paths:?}");
        };
        assert_eq!(failed.phase, crate::api::ReadBackPhase::Failed);
        assert_eq!(
            failed.message.as_deref(),
            Some("not drained: no Secret tenant-store-key")
        );
        assert_eq!((paths[0].entry, paths[0].path.as_str()), (0, "/out"));
        // A path whose outcome was already known keeps it.
        assert_eq!(paths[1].work, PathWork::Record(known));
    }

    /// docs/contract.md "A read-back slot is made once": the packer is exec'd only where the
    /// pod serves the path's slot; a pod whose holder mount moved (or a look-alike without the
    /// slots) is never read, the path Failed saying why.
    #[test]
    fn a_teardown_never_drains_a_path_where_the_pods_mounts_are_not_its_slot() {
        let caps = CapSettings::default();
        let mut r = with_phase(
            run_with(&[("/out", false), ("/logs", false)]),
            Phase::Running,
        );
        r.spec.stop = true;
        let mut moved = with_slots(a_pod(true, true), &r);
        let mut holder = moved.spec.as_mut().unwrap().containers.iter_mut();
        let holder = holder
            .find(|c| c.name == crate::pod::HOLDER_CONTAINER)
            .unwrap();
        let mut mounts = holder.volume_mounts.as_mut().unwrap().iter_mut();
        let mount = mounts.find(|m| m.name == "readback-0").unwrap();
        mount.mount_path = "/sandboxrun-readback/etc".into();
        let paths = teardown(&r, Some(&moved), &Trigger::Stop, &caps, 300, now()).paths;
        let PathWork::Record(failed) = &paths[0].work else {
            panic!("drained where the pod moved the mount: {paths:?}");
        };
        assert_eq!(failed.phase, ReadBackPhase::Failed);
        let message = failed.message.as_deref().unwrap_or_default();
        assert!(message.starts_with(NOT_SERVED), "{message}");
        assert!(message.contains("/sandboxrun-readback/etc"), "{message}");
        // The other path, served as its slot, is drained there.
        assert!(matches!(
            &paths[1].work,
            PathWork::Drain { holder_path, .. } if holder_path == "/sandboxrun-readback/logs"
        ));
        // A pod without the slots at all is not read either.
        let bare = a_pod(true, true);
        let paths = teardown(&r, Some(&bare), &Trigger::Stop, &caps, 300, now()).paths;
        for path in &paths {
            assert!(
                matches!(&path.work, PathWork::Record(e) if e.phase == ReadBackPhase::Failed),
                "{path:?}"
            );
        }
    }

    #[test]
    fn each_teardown_path_gets_its_outcome_and_the_deadline_runs_from_the_start() {
        let caps = CapSettings::default();
        let mut r = with_phase(
            run_with(&[("/out", false), ("/logs", false)]),
            Phase::Running,
        );
        r.spec.stop = true;
        let works = |plan: &TeardownPlan| -> Vec<String> {
            plan.paths
                .iter()
                .map(|p| match &p.work {
                    PathWork::Record(e) => format!("{} {}", p.path, e.phase.as_str()),
                    PathWork::Drain { .. } => format!("{} drain", p.path),
                })
                .collect()
        };
        // Begun now: opened with an Event and the Draining status; both paths drained.
        let pod = with_slots(a_pod(true, true), &r);
        let plan = teardown(&r, Some(&pod), &Trigger::Stop, &caps, 300, now());
        assert_eq!(
            line(&plan.opening),
            "[TearingDown/Teardown@pod] | Draining | [] | await"
        );
        assert_eq!(works(&plan), ["/out drain", "/logs drain"]);
        assert_eq!(plan.drain_left, Duration::from_secs(300));
        assert!(plan.holder_running);
        assert!(matches!(
            plan.paths[0].work,
            PathWork::Drain { cap_bytes, previous_attempts: 0, ref holder_path }
                if cap_bytes == caps.default_bytes && holder_path == "/sandboxrun-readback/out"
        ));
        // The holder is not running: the paths cannot be read.
        let plan = teardown(
            &r,
            Some(&a_pod(false, true)),
            &Trigger::Stop,
            &caps,
            300,
            now(),
        );
        assert_eq!(works(&plan), ["/out Failed", "/logs Failed"]);
        assert!(!plan.holder_running);
        // The workload never started (no pod, never seen running): nothing was written.
        let mut never = run_with(&[("/out", false)]);
        never.status = Some(SandboxRunStatus {
            phase: Some(Phase::Pending),
            ..Default::default()
        });
        let plan = teardown(
            &never,
            Some(&a_pod(true, false)),
            &Trigger::Stop,
            &caps,
            300,
            now(),
        );
        assert_eq!(works(&plan), ["/out Empty"]);
        // Resumed 100 s into the drain, /out already drained: no Event, no write, 200 s left.
        let mut resumed = r.clone();
        if let Some(s) = resumed.status.as_mut() {
            s.phase = Some(Phase::Draining);
            s.read_back = vec![ReadBackStatus {
                path: "/out".into(),
                phase: ReadBackPhase::Drained,
                ..Default::default()
            }];
            set_condition_unknown(
                &mut s.conditions,
                conditions::DRAINED,
                "Draining",
                "",
                None,
                now(),
            );
        }
        let plan = teardown(&resumed, Some(&pod), &Trigger::Stop, &caps, 300, later(100));
        assert_eq!(line(&plan.opening), "[] | - | [] | await");
        assert_eq!(works(&plan), ["/logs drain"]);
        assert_eq!(plan.drain_left, Duration::from_secs(200));
        // Past the deadline: nothing left (the drains fail at once).
        let plan = teardown(&resumed, Some(&pod), &Trigger::Stop, &caps, 300, later(400));
        assert_eq!(plan.drain_left, Duration::ZERO);
    }

    #[test]
    fn a_teardown_ends_with_one_summary_the_final_status_and_the_release() {
        let r = with_phase(run_with(&[("/out", false)]), Phase::Running);
        let draining = drained(r.clone()).status.unwrap_or_default();
        assert_eq!(
            line(&teardown_end(
                &r,
                draining.clone(),
                true,
                true,
                Retention::Retain,
                now()
            )),
            "[Stopped/Teardown@pod] | Stopped | [MarkDrained DeletePod { at_once: true }] | await"
        );
        // A clean drain is told in the Event that announces the end, with every path.
        let end = teardown_end(&r, draining.clone(), true, true, Retention::Retain, now());
        assert!(
            end.events[0].note.starts_with(
                "run stopped; read-back paths drained. 1 path(s): 1 Drained. /out: Drained"
            ),
            "{}",
            end.events[0].note
        );
        let gone = deleting(r.clone());
        assert_eq!(
            line(&teardown_end(
                &gone,
                draining.clone(),
                false,
                false,
                Retention::Delete,
                now()
            )),
            "[Stopped/Teardown@pod] | Stopped | [PurgeStoredFiles RemoveFinalizer] | await"
        );
        let mut failed = draining;
        failed.read_back[0].phase = ReadBackPhase::Failed;
        assert_eq!(
            line(&teardown_end(&gone, failed, false, false, Retention::Retain, now())),
            "[!sandbox_runfiles_drain_failed/Drain@pod !Stopped/Teardown@pod] | Stopped | [RemoveFinalizer] | await"
        );
    }

    mod teardown_progress {
        use super::*;

        fn opening() -> Plan {
            Plan {
                events: vec![PlannedEvent::normal(
                    events::TEARING_DOWN,
                    "tearing down",
                    "Teardown",
                )],
                status: Some(status_with(&["/a", "/b", "/c"])),
                ..Plan::wait(Requeue::AwaitChange)
            }
        }

        fn status_with(paths: &[&str]) -> SandboxRunStatus {
            SandboxRunStatus {
                phase: Some(Phase::Draining),
                read_back: paths
                    .iter()
                    .map(|p| ReadBackStatus {
                        path: p.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }
        }

        fn drained(path: &str) -> Option<ReadBackStatus> {
            Some(ReadBackStatus {
                path: path.to_string(),
                phase: ReadBackPhase::Drained,
                ..Default::default()
            })
        }

        fn begin(waits: bool, settle: Duration) -> (TeardownProgress, Option<Plan>) {
            TeardownProgress::begin(
                opening(),
                waits,
                status_with(&["/a", "/b", "/c"]),
                3,
                settle,
            )
        }

        #[test]
        fn an_opening_that_does_not_wait_is_written_at_once_then_each_outcome_but_the_last() {
            let (mut p, now) = begin(false, SETTLE);
            assert_eq!(now, Some(opening()));
            assert!(!p.waits_for_quiet_window());
            let first = p.outcome(0, drained("/a")).expect("written at once");
            assert_eq!(first.read_back[0].phase, ReadBackPhase::Drained);
            assert!(p.outcome(2, drained("/c")).is_some());
            assert_eq!(
                p.outcome(1, drained("/b")),
                None,
                "the last goes with the end"
            );
            let end = p.finish().expect("not stopped");
            assert!(end
                .read_back
                .iter()
                .all(|e| e.phase == ReadBackPhase::Drained));
        }

        #[test]
        fn a_waiting_opening_is_written_only_when_the_quiet_window_passes_with_what_is_known() {
            let (mut p, now) = begin(true, SETTLE);
            assert_eq!(now, None);
            assert!(p.waits_for_quiet_window());
            assert_eq!(
                p.outcome(0, drained("/a")),
                None,
                "before the window: nothing"
            );
            let late = p.quiet_window_passed().expect("the opening, late");
            assert_eq!(late.events, opening().events);
            let status = late.status.expect("with the outcomes so far");
            assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
            assert_eq!(status.read_back[1].phase, ReadBackPhase::Pending);
            assert!(!p.waits_for_quiet_window());
            assert_eq!(p.quiet_window_passed(), None, "written once");
            assert!(p.outcome(1, drained("/b")).is_some());
            assert_eq!(p.outcome(2, drained("/c")), None);
            assert!(p.finish().is_some());
        }

        #[test]
        fn a_teardown_that_drains_within_the_window_writes_nothing_before_its_end() {
            let (mut p, _) = begin(true, SETTLE);
            for (i, path) in ["/a", "/b", "/c"].iter().enumerate() {
                assert_eq!(p.outcome(i, drained(path)), None);
            }
            assert!(p.finish().is_some());
        }

        #[test]
        fn no_quiet_window_means_no_wait() {
            let (p, now) = begin(true, Duration::ZERO);
            assert!(now.is_some());
            assert!(!p.waits_for_quiet_window());
        }

        #[test]
        fn a_replica_that_stops_draining_records_nothing_more_and_plans_no_end() {
            let (mut p, _) = begin(true, SETTLE);
            assert_eq!(p.outcome(0, None), None);
            assert!(!p.waits_for_quiet_window());
            assert_eq!(p.quiet_window_passed(), None);
            assert_eq!(p.outcome(1, drained("/b")), None, "stopped: not recorded");
            assert_eq!(p.finish(), None);
        }
    }
}
