//! The per-path idle bound (docs/contract.md "Drain memory", issue #25 item 2c): a packer that
//! stops sending, or trickles a byte every few seconds, must not hold a drain slot until the run's
//! whole drain deadline. The exec's stdout is read through an [`IdleGuard`]: the time the drain
//! spends *waiting on the pod* is counted, and it is forgiven only when the pod has sent
//! [`MIN_PROGRESS_BYTES`] since the last time it was forgiven. Waiting longer than the idle bound
//! in all fails the read, and the path ends `Failed` saying so (not retried: the same pod would
//! trickle again).
//!
//! Only waiting counts: while the drain itself is busy (a slow upload holds back its reads), the
//! reader is not polled, and no idle time accrues against the pod.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Default idle bound of a path (`run --drain-idle-timeout`).
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes the pod must send for the time it kept the drain waiting to be forgiven: a packer of
/// ours sends at least a 512-byte header per entry and fills 64 KiB in well under a second, so a
/// stream that needs more than the idle bound of waiting to deliver this much is trickling.
pub(crate) const MIN_PROGRESS_BYTES: u64 = 64 * 1024;

/// The pure part: how long the drain has waited on the pod since it last made enough progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdleClock {
    /// The bound.
    idle: Duration,
    /// Waiting counted since the last forgiveness.
    waited: Duration,
    /// Bytes received since the last forgiveness.
    progress: u64,
}

impl IdleClock {
    /// A clock with nothing counted yet.
    pub(crate) fn new(idle: Duration) -> Self {
        IdleClock {
            idle,
            waited: Duration::ZERO,
            progress: 0,
        }
    }

    /// `bytes` arrived after the drain waited `waited` for them. Returns whether the bound is
    /// still kept.
    pub(crate) fn arrived(&mut self, bytes: u64, waited: Duration) -> bool {
        self.waited = self.waited.saturating_add(waited);
        self.progress = self.progress.saturating_add(bytes);
        if self.progress >= MIN_PROGRESS_BYTES {
            self.waited = Duration::ZERO;
            self.progress = 0;
            return true;
        }
        self.waited < self.idle
    }

    /// How much longer the drain may wait, having waited `waiting` so far on the read in flight
    /// (zero: the bound is reached).
    pub(crate) fn left(&self, waiting: Duration) -> Duration {
        self.idle
            .saturating_sub(self.waited)
            .saturating_sub(waiting)
    }
}

/// The error of a read cut off by the idle bound (the caller also sees [`IdleGuard::tripped`]).
#[derive(Debug, thiserror::Error)]
#[error("the packer kept the drain waiting {idle:?} in all without sending {min_progress} bytes (the per-path idle bound, --drain-idle-timeout): the stream was cut off")]
pub(crate) struct IdleTimeout {
    /// The bound.
    pub(crate) idle: Duration,
    /// [`MIN_PROGRESS_BYTES`].
    pub(crate) min_progress: u64,
}

/// Reads the exec's stdout under the idle bound (see the module doc).
pub(crate) struct IdleGuard<R> {
    inner: R,
    clock: IdleClock,
    /// When the read in flight started waiting (the inner reader returned `Pending`).
    waiting_since: Option<Instant>,
    timer: Pin<Box<Sleep>>,
    tripped: Arc<AtomicBool>,
}

impl<R> IdleGuard<R> {
    /// `inner` under a bound of `idle`; the flag says afterwards whether the bound cut it off.
    pub(crate) fn new(inner: R, idle: Duration) -> (Self, Arc<AtomicBool>) {
        let tripped = Arc::new(AtomicBool::new(false));
        let guard = IdleGuard {
            inner,
            clock: IdleClock::new(idle),
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep(idle)),
            tripped: Arc::clone(&tripped),
        };
        (guard, tripped)
    }

    fn trip(&self) -> Poll<io::Result<()>> {
        self.tripped.store(true, Ordering::Relaxed);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            IdleTimeout {
                idle: self.clock.idle,
                min_progress: MIN_PROGRESS_BYTES,
            },
        )))
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for IdleGuard<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.tripped.load(Ordering::Relaxed) {
            return self.trip();
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                let waited = self
                    .waiting_since
                    .take()
                    .map_or(Duration::ZERO, |t| t.elapsed());
                if n > 0 && !self.clock.arrived(n, waited) {
                    // An error delivers no bytes.
                    buf.set_filled(before);
                    return self.trip();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let now = Instant::now();
                let since = *self.waiting_since.get_or_insert(now);
                let left = self.clock.left(now.saturating_duration_since(since));
                if left.is_zero() {
                    return self.trip();
                }
                let this = &mut *self;
                this.timer.as_mut().reset(now + left);
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => self.trip(),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn waiting_is_forgiven_only_by_enough_progress() {
        let mut clock = IdleClock::new(Duration::from_secs(60));
        // A byte every 5 s: the waits add up, and the 12th crosses the bound.
        let kept = (0..20)
            .take_while(|_| clock.arrived(1, Duration::from_secs(5)))
            .count();
        assert_eq!(kept, 11);
        // A stream that waits as long but sends 64 KiB each time is never cut off.
        let mut clock = IdleClock::new(Duration::from_secs(60));
        assert!((0..100).all(|_| clock.arrived(MIN_PROGRESS_BYTES, Duration::from_secs(59))));
        assert_eq!(clock.left(Duration::from_secs(10)), Duration::from_secs(50));
        assert_eq!(clock.left(Duration::from_secs(61)), Duration::ZERO);
    }

    /// Sends `chunk` bytes every `every`, `count` times, then ends.
    struct Trickle {
        every: Duration,
        chunk: usize,
        count: usize,
        /// Bytes of the current chunk not delivered yet (delivered without waiting).
        left: usize,
        sleep: Option<Pin<Box<Sleep>>>,
    }

    fn trickle(every: u64, chunk: usize, count: usize) -> Trickle {
        Trickle {
            every: Duration::from_secs(every),
            chunk,
            count,
            left: 0,
            sleep: None,
        }
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if self.left == 0 {
                if self.count == 0 {
                    return Poll::Ready(Ok(()));
                }
                let every = self.every;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
                self.count -= 1;
                self.left = self.chunk;
            }
            let n = self.left.min(buf.remaining());
            buf.put_slice(&vec![7u8; n]);
            self.left -= n;
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_packer_is_cut_off_at_the_idle_bound() {
        let (mut guard, tripped) = IdleGuard::new(trickle(3, 1, 1000), Duration::from_secs(60));
        let started = Instant::now();
        let err = guard.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("idle bound"), "{err}");
        assert!(tripped.load(Ordering::Relaxed));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(60) && took <= Duration::from_secs(63),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_packer_is_cut_off_and_a_slow_but_steady_one_is_not() {
        let (mut guard, tripped) = IdleGuard::new(trickle(3600, 1, 1), Duration::from_secs(60));
        let started = Instant::now();
        assert!(guard.read_to_end(&mut Vec::new()).await.is_err());
        assert!(tripped.load(Ordering::Relaxed));
        assert_eq!(started.elapsed(), Duration::from_secs(60));

        // 64 KiB every 50 s: slow, but it keeps coming (and ends).
        let steady = trickle(50, MIN_PROGRESS_BYTES as usize, 5);
        let (mut guard, tripped) = IdleGuard::new(steady, Duration::from_secs(60));
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.expect("steady");
        assert_eq!(out.len(), 5 * MIN_PROGRESS_BYTES as usize);
        assert!(!tripped.load(Ordering::Relaxed));
    }
}
