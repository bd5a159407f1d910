//! Planning what a run whose teardown waits for a drain slot says (docs/contract.md "Fair drain
//! slots"): nothing within the quiet window, then one `DrainQueued` Event with its place in the
//! queue — `kubectl describe` shows it, and its age is the wait so far.

use std::time::Duration;

use super::model::{Plan, Requeue, IN_FLIGHT_REQUEUE, LOOK_AGAIN_MARGIN};
use crate::controller::drains::pool::Queued;
use crate::controller::events::{PlannedEvent, DRAIN_QUEUED};

/// The Events API action of [`DRAIN_QUEUED`].
const ACTION: &str = "WaitForDrainSlot";

/// What the reconcile of a run whose teardown is `queued` publishes, the quiet window being
/// `settle`. Its caller remembers an announcement it carried out.
pub(crate) fn queued(queued: &Queued, settle: Duration) -> Plan {
    if queued.announced {
        return Plan::wait(Requeue::After(IN_FLIGHT_REQUEUE));
    }
    if queued.waited < settle {
        return Plan::wait(Requeue::After(settle - queued.waited + LOOK_AGAIN_MARGIN));
    }
    let position = &queued.position;
    let first = if position.urgent {
        " (served first: its pod is being deleted or evicted)"
    } else {
        ""
    };
    let note = format!(
        "The teardown waits for a drain slot: place {} of {} waiting teardowns{first}. \
         Its drain deadline starts when it has its slot.",
        position.place, position.waiting
    );
    Plan {
        events: vec![PlannedEvent::normal(DRAIN_QUEUED, note, ACTION)],
        ..Plan::wait(Requeue::After(IN_FLIGHT_REQUEUE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::drains::queue::Position;

    fn waiting(waited: Duration, announced: bool, urgent: bool) -> Queued {
        Queued {
            position: Position {
                place: 3,
                waiting: 40,
                since: std::time::Instant::now(),
                urgent,
            },
            waited,
            announced,
        }
    }

    #[test]
    fn a_wait_is_announced_once_and_only_past_the_quiet_window() {
        let settle = Duration::from_secs(2);
        let quiet = queued(&waiting(Duration::from_millis(500), false, false), settle);
        assert!(quiet.events.is_empty(), "a short wait is not announced");
        assert_eq!(
            quiet.requeue,
            Requeue::After(Duration::from_millis(1500) + LOOK_AGAIN_MARGIN)
        );
        let told = queued(&waiting(Duration::from_secs(3), false, false), settle);
        assert_eq!(told.events.len(), 1);
        assert_eq!(told.events[0].reason, DRAIN_QUEUED);
        assert!(!told.events[0].warning);
        assert!(
            told.events[0].note.contains("place 3 of 40"),
            "{}",
            told.events[0].note
        );
        assert!(told.status.is_none() && told.effects.is_empty());
        let urgent = queued(&waiting(Duration::from_secs(3), false, true), settle);
        assert!(urgent.events[0].note.contains("served first"));
        let again = queued(&waiting(Duration::from_secs(60), true, false), settle);
        assert!(again.events.is_empty(), "not announced twice");
        assert_eq!(again.requeue, Requeue::After(IN_FLIGHT_REQUEUE));
    }
}
