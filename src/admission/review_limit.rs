//! How many SubjectAccessReviews the webhook asks the apiserver (docs/contract.md "A run uses
//! only its author's rights", "The webhook is no RBAC oracle"; issue #38 item 6). The webhook's
//! endpoint is reachable by whatever the network lets through, and every AdmissionReview it is
//! sent names a user of the sender's choosing: unbounded, it would answer "may user X do Y?" for
//! made-up users as fast as it is asked, and load the apiserver with those questions. So:
//!
//! - at most [`MAX_REVIEWS_PER_ADMISSION`] access reviews for one AdmissionReview: one that would
//!   need more is refused whole, none asked (a finding says so);
//! - at most [`RATE_PER_SECOND`] a second across every AdmissionReview, with bursts of
//!   [`BURST`] (a token bucket): past it, a review is refused (fail closed: a run is never
//!   admitted unchecked), and its author retries.
//!
//! [`TokenBucket`] is pure (the clock is passed in); [`admit`] is the process-wide limiter.

use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use crate::policy::access::ACCESS_RULE;
use crate::policy::rules::Finding;

/// Most access reviews one AdmissionReview may need: a run exercises one right per distinct
/// Secret, ConfigMap, PVC, ServiceAccount, template or store it names.
pub(crate) const MAX_REVIEWS_PER_ADMISSION: usize = 32;
/// Access reviews a second, sustained, across every AdmissionReview.
pub(crate) const RATE_PER_SECOND: f64 = 50.0;
/// Access reviews asked at once before the rate applies.
pub(crate) const BURST: f64 = 200.0;

/// A token bucket: `capacity` tokens, refilled at `rate` a second. Pure: the caller gives the
/// time.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    capacity: f64,
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of `capacity` tokens, refilled at `rate` a second from `now`.
    pub(crate) fn new(capacity: f64, rate: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            capacity,
            rate,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes `n` tokens at `now` if the bucket holds them (then true); else takes none.
    pub(crate) fn try_take(&mut self, n: usize, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = self.last.max(now);
        let wanted = n as f64;
        if wanted > self.tokens {
            return false;
        }
        self.tokens -= wanted;
        true
    }
}

/// Why `wanted` access reviews may not be asked for one AdmissionReview now (None: they may,
/// and are counted against `bucket`).
pub(crate) fn refusal(wanted: usize, bucket: &mut TokenBucket, now: Instant) -> Option<Finding> {
    if wanted > MAX_REVIEWS_PER_ADMISSION {
        return Some(Finding::fail(
            ACCESS_RULE,
            "spec",
            format!(
                "this run would need {wanted} access checks of its author's rights, more than \
                 the webhook asks for one run ({MAX_REVIEWS_PER_ADMISSION}); refused unchecked"
            ),
            "name fewer distinct Secrets, ConfigMaps, volumes and templates in one run",
        ));
    }
    if bucket.try_take(wanted, now) {
        return None;
    }
    Some(Finding::fail(
        ACCESS_RULE,
        "spec",
        format!(
            "the webhook is asking the apiserver too many access checks right now (more than \
             {RATE_PER_SECOND} a second); this run's {wanted} were not asked, so it is refused"
        ),
        "retry in a few seconds; if it persists, report it to the operator's admin (the \
         webhook's endpoint may be flooded)",
    ))
}

static BUCKET: LazyLock<Mutex<TokenBucket>> =
    LazyLock::new(|| Mutex::new(TokenBucket::new(BURST, RATE_PER_SECOND, Instant::now())));

/// [`refusal`] against the process-wide bucket.
pub(crate) fn admit(wanted: usize) -> Option<Finding> {
    let mut bucket = BUCKET
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    refusal(wanted, &mut bucket, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bucket_allows_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 5.0, start);
        assert!(bucket.try_take(10, start), "the burst");
        assert!(!bucket.try_take(1, start), "empty");
        assert!(
            !bucket.try_take(3, start + Duration::from_millis(500)),
            "2.5 refilled"
        );
        assert!(bucket.try_take(2, start + Duration::from_millis(500)));
        // Never more than its capacity, however long it rested.
        let later = start + Duration::from_secs(3600);
        assert!(!bucket.try_take(11, later));
        assert!(bucket.try_take(10, later));
        // A clock that goes back refills nothing and takes nothing extra.
        assert!(!bucket.try_take(1, start));
    }

    #[test]
    fn a_review_needing_too_many_access_checks_or_past_the_rate_is_refused() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(BURST, RATE_PER_SECOND, now);
        let too_many = refusal(MAX_REVIEWS_PER_ADMISSION + 1, &mut bucket, now)
            .expect("refused")
            .message;
        assert!(
            too_many.contains(&format!("{}", MAX_REVIEWS_PER_ADMISSION + 1))
                && too_many.contains("refused unchecked"),
            "{too_many}"
        );
        assert!(refusal(MAX_REVIEWS_PER_ADMISSION, &mut bucket, now).is_none());
        // A flood of made-up users' reviews: the burst is asked, then no more at that instant.
        let mut asked = MAX_REVIEWS_PER_ADMISSION;
        while refusal(2, &mut bucket, now).is_none() {
            asked += 2;
        }
        assert_eq!(asked, 200, "the burst, not one more");
        let flooded = refusal(1, &mut bucket, now).expect("refused").message;
        assert!(flooded.contains("too many access checks"), "{flooded}");
        // A second later, the rate's worth again.
        let later = now + Duration::from_secs(1);
        assert!(refusal(25, &mut bucket, later).is_none());
        assert!(refusal(25, &mut bucket, later).is_none());
        assert!(refusal(1, &mut bucket, later).is_some());
    }
}
