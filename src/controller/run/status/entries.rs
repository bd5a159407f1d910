//! Every declared path of a run has one status entry, in the declared order.

use crate::api::{ReadBackStatus, SandboxRun, SandboxRunStatus};

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
