//! The status a run is given at each stage of its life — tracked (Pending/Running), tearing down
//! (Draining), finished, its pod lost — built purely from the run, what was observed and `now`
//! (no client, no clock). Conditions are set through [`super::conditions`]; the stage that writes
//! each status is chosen in [`super::plan`].

mod ending;
mod lost;
mod tracked;

use crate::api::{ReadBackStatus, SandboxRun, SandboxRunStatus};

pub(crate) use ending::{draining_status, finished_status};
pub(crate) use lost::{image_unresolvable_status, never_started_entry, pod_lost_status};
pub(crate) use tracked::{pending_status, set_pending, tracked_status};

/// Makes sure every declared path has a status entry (Pending until drained).
pub(crate) fn ensure_pending_entries(run: &SandboxRun, status: &mut SandboxRunStatus) {
    for p in run.spec.read_back_paths() {
        if !status.read_back.iter().any(|e| e.path == p.path) {
            status.read_back.push(ReadBackStatus {
                path: p.path.clone(),
                ..Default::default()
            });
        }
    }
    let order: Vec<&str> = run
        .spec
        .read_back_paths()
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    status
        .read_back
        .retain(|e| order.contains(&e.path.as_str()));
    status
        .read_back
        .sort_by_key(|e| order.iter().position(|p| *p == e.path));
}
