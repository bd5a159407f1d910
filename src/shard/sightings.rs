//! When a Lease counts as expired (pure, docs/contract.md "Shards"): from this replica's own
//! clock, never from the holder's. A Lease is expired when its record (holder, renew time) has
//! not changed for its whole duration since this replica first saw that record, so clocks that
//! disagree between machines never let a replica take a Lease early. A replica that just
//! started has seen nothing change yet: it waits a whole duration before it takes a Lease whose
//! holder is gone.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The part of a Lease that its holder changes on every renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// `spec.holderIdentity` (None or empty: released).
    pub holder: Option<String>,
    /// `spec.renewTime`, as written.
    pub renewed: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
}

impl Record {
    /// The holder, when the Lease is held.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// What this replica saw of each Lease, and when (by name).
#[derive(Debug, Default)]
pub(crate) struct Sightings {
    seen: HashMap<String, (Record, Instant)>,
}

impl Sightings {
    /// Records `record` of the Lease `name` as seen at `now`; returns its live holder: None when
    /// released, or when the same record has been seen unchanged for its duration (expired).
    pub(crate) fn see(&mut self, name: &str, record: Record, now: Instant) -> Option<String> {
        let first_seen = match self.seen.get(name) {
            Some((last, since)) if *last == record => *since,
            _ => now,
        };
        let holder = record.holder().map(str::to_string);
        let duration = record.duration;
        self.seen.insert(name.to_string(), (record, first_seen));
        let expired = now.saturating_duration_since(first_seen) >= duration;
        holder.filter(|_| !expired)
    }

    /// Forgets the Leases not in `names` (deleted).
    pub(crate) fn keep_only<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::HashSet<&str> = names.into_iter().collect();
        self.seen.retain(|name, _| keep.contains(name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renewed: &str) -> Record {
        Record {
            holder: Some(holder.into()).filter(|h: &String| !h.is_empty()),
            renewed: Some(renewed.into()),
            duration: Duration::from_secs(15),
        }
    }

    #[test]
    fn a_lease_expires_only_after_a_whole_duration_unchanged_on_our_clock() {
        let t0 = Instant::now();
        let mut s = Sightings::default();
        // First sight: live even if the holder's clock says it renewed long ago.
        assert_eq!(
            s.see("l", record("a", "2020-01-01T00:00:00Z"), t0)
                .as_deref(),
            Some("a")
        );
        assert_eq!(
            s.see(
                "l",
                record("a", "2020-01-01T00:00:00Z"),
                t0 + Duration::from_secs(14)
            )
            .as_deref(),
            Some("a")
        );
        // Renewed: the wait starts again.
        assert_eq!(
            s.see(
                "l",
                record("a", "2020-01-01T00:00:10Z"),
                t0 + Duration::from_secs(14)
            )
            .as_deref(),
            Some("a")
        );
        assert_eq!(
            s.see(
                "l",
                record("a", "2020-01-01T00:00:10Z"),
                t0 + Duration::from_secs(28)
            )
            .as_deref(),
            Some("a")
        );
        assert_eq!(
            s.see(
                "l",
                record("a", "2020-01-01T00:00:10Z"),
                t0 + Duration::from_secs(29)
            ),
            None,
            "15 s unchanged: expired"
        );
        assert_eq!(s.see("r", record("", "x"), t0), None, "released");
        s.keep_only(["r"]);
        assert_eq!(
            s.see(
                "l",
                record("a", "2020-01-01T00:00:10Z"),
                t0 + Duration::from_secs(60)
            )
            .as_deref(),
            Some("a"),
            "forgotten, then seen anew"
        );
    }
}
