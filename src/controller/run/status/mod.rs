//! The status a run is given at each stage of its life — tracked (Pending/Running), tearing down
//! (Draining), finished, its pod lost — built purely from the run, what was observed and `now`
//! (no client, no clock). Conditions are set through [`crate::controller::conditions`]; the stage that writes
//! each status is chosen in [`super::plan`].

mod ending;
mod entries;
mod lost;
mod tracked;

pub(crate) use ending::{draining_status, finished_status};
pub(crate) use entries::ensure_pending_entries;
pub(crate) use lost::{image_unresolvable_status, never_started_entry, pod_lost_status};
#[cfg(test)]
pub(crate) use tracked::{cannot_start_reasons, ready_reasons};
pub(crate) use tracked::{pending_status, set_pending, tracked_status};
