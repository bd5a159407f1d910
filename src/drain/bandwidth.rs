//! The replica's drain bandwidth (`run --max-drain-bytes-per-second`, docs/contract.md "Drain
//! memory" for what a drain holds): every byte a drain reads from a packer's exec stream crossed
//! the apiserver, so one token bucket, shared by all of this replica's drains, bounds the bytes
//! they read per second together. It protects the apiserver, and it makes a replica's own limit
//! the bottleneck the way a pod's network is in a real cluster (docs/operations.md "Scaling").
//!
//! - [`TokenBucket`] is the pure accounting: bytes read are charged after the read, and the
//!   answer is how long the reader must wait before its next read (a reservation: a reader that
//!   came later waits behind the debt of the earlier ones, so the readers share the rate in the
//!   order they read). Constant memory whatever the number of drains.
//! - [`Throttled`] is an exec stream read through the bucket: while it waits it does not poll the
//!   stream, so the idle bound (src/drain/idle.rs) never counts the replica's own pacing against
//!   the pod.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The burst the bucket holds when full, as a share of one second's rate (100 ms), never below
/// [`MIN_BURST`]: enough for the exec's frames to flow without a pause each, small enough that the
/// rate holds over any second.
const BURST_DIVISOR: u64 = 10;
/// The smallest burst (one read of the drain's pipeline).
const MIN_BURST: u64 = 64 * 1024;

/// The pure accounting of a byte rate: tokens are bytes, refilled at `rate` a second up to
/// `burst`; a read is charged after it happened and may take the balance below zero (a debt the
/// readers wait out).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenBucket {
    /// Bytes a second.
    rate: u64,
    /// Most tokens held.
    burst: u64,
    /// The balance, in bytes (negative: a debt).
    tokens: f64,
    /// When the balance was last brought up to date.
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `rate` bytes a second (at least 1) at `now`.
    pub(crate) fn new(rate: u64, now: Instant) -> TokenBucket {
        let rate = rate.max(1);
        let burst = (rate / BURST_DIVISOR).max(MIN_BURST);
        TokenBucket {
            rate,
            burst,
            tokens: burst as f64,
            at: now,
        }
    }

    /// The bytes the bucket holds when full.
    #[cfg(test)]
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// Charges `bytes` just read at `now`; returns how long the reader waits before its next read
    /// (zero while the balance is not negative).
    pub(crate) fn charge(&mut self, bytes: u64, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= bytes as f64;
        self.debt_wait()
    }

    /// How long a reader arriving at `now` would wait with nothing charged (the debt left).
    #[cfg(test)]
    pub(crate) fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.debt_wait()
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.burst as f64);
    }

    fn debt_wait(&self) -> Duration {
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate as f64)
        }
    }
}

/// The bandwidth of this replica's drains: unlimited, or one bucket shared by every drain.
/// Cheap to clone (the bucket is shared).
#[derive(Debug, Clone, Default)]
pub(crate) struct DrainBandwidth {
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

impl DrainBandwidth {
    /// `bytes_per_second` shared by every drain; 0 is unlimited.
    pub(crate) fn new(bytes_per_second: u64) -> DrainBandwidth {
        DrainBandwidth {
            bucket: (bytes_per_second > 0).then(|| {
                Arc::new(Mutex::new(TokenBucket::new(
                    bytes_per_second,
                    Instant::now(),
                )))
            }),
        }
    }

    /// Whether a limit is set.
    pub(crate) fn is_limited(&self) -> bool {
        self.bucket.is_some()
    }

    /// `inner` read through this bandwidth (as is when unlimited).
    pub(crate) fn throttle<R>(&self, inner: R) -> Throttled<R> {
        Throttled {
            inner,
            bucket: self.bucket.clone(),
            pause: None,
        }
    }
}

/// A stream read through a [`DrainBandwidth`]: each read is charged to the shared bucket, and the
/// next read waits out the debt. Reads are never split or buffered (constant memory).
pub(crate) struct Throttled<R> {
    inner: R,
    bucket: Option<Arc<Mutex<TokenBucket>>>,
    /// The wait before the next read, once a read left a debt.
    pause: Option<Pin<Box<Sleep>>>,
}

impl<R> Throttled<R> {
    /// The debt `bytes` leaves on the shared bucket, as a wait (zero: none, or unlimited, or a
    /// poisoned lock: the drain goes on unthrottled rather than fail).
    fn charge(&self, bytes: u64) -> Duration {
        match &self.bucket {
            Some(bucket) => bucket
                .lock()
                .map(|mut b| b.charge(bytes, Instant::now()))
                .unwrap_or_default(),
            None => Duration::ZERO,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Throttled<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(pause) = self.pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pause = None;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            let n = (buf.filled().len() - before) as u64;
            let wait = self.charge(n);
            if !wait.is_zero() {
                self.pause = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const MB: u64 = 1_000_000;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_lets_a_burst_through_then_charges_the_debt_as_a_wait() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10 * MB, t0);
        assert_eq!(b.burst(), MB, "a tenth of a second's rate");
        assert_eq!(b.charge(MB, t0), Duration::ZERO, "the burst is free");
        assert_eq!(b.charge(MB, t0), Duration::from_millis(100));
        // A second reader at the same instant waits behind the first one's debt too.
        assert_eq!(b.charge(MB, t0), Duration::from_millis(200));
        // Time pays the debt back at the rate.
        assert_eq!(
            b.wait(t0 + Duration::from_millis(150)),
            Duration::from_millis(50)
        );
        assert_eq!(b.wait(t0 + Duration::from_millis(200)), Duration::ZERO);
        // An idle bucket fills up to its burst, never beyond: a long pause buys no flood.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.charge(MB, later), Duration::ZERO);
        assert_eq!(b.charge(MB, later), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_rate_keeps_a_burst_of_one_read_and_a_zero_rate_is_one_byte() {
        let t0 = Instant::now();
        let mut slow = TokenBucket::new(1000, t0);
        assert_eq!(slow.burst(), MIN_BURST);
        assert_eq!(slow.charge(MIN_BURST + 1000, t0), Duration::from_secs(1));
        assert_eq!(TokenBucket::new(0, t0).rate, 1);
    }

    /// Yields `total` bytes in reads of at most `chunk`, never waiting.
    struct Source {
        left: u64,
        chunk: usize,
    }

    impl AsyncRead for Source {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = (buf.remaining() as u64)
                .min(self.left)
                .min(self.chunk as u64) as usize;
            buf.put_slice(&vec![7u8; n]);
            self.left -= n as u64;
            Poll::Ready(Ok(()))
        }
    }

    async fn read_all<R: AsyncRead + Unpin>(mut r: R) -> u64 {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                return total;
            }
            total += n as u64;
        }
    }

    /// Time here is tokio's paused clock: it moves only by the sleeps the reader asks for, so
    /// the elapsed time is the pacing the bucket decided, not the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn drains_sharing_one_bandwidth_read_at_its_rate_together() {
        let bw = DrainBandwidth::new(10 * MB);
        assert!(bw.is_limited());
        let t0 = Instant::now();
        let each = 20 * MB;
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let r = bw.throttle(Source {
                    left: each,
                    chunk: 64 * 1024,
                });
                tokio::spawn(read_all(r))
            })
            .collect();
        for r in readers {
            assert_eq!(r.await.unwrap(), each, "every byte is delivered");
        }
        let took = t0.elapsed();
        // 80 MB at 10 MB/s: 8 s less the free burst (0.1 s), and no more than the last read's debt
        // (one chunk per reader) beyond it.
        let floor = Duration::from_millis(7_900);
        assert!(took >= floor, "{took:?}");
        assert!(took <= Duration::from_millis(7_900 + 30), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_bandwidth_never_pauses_a_read() {
        let bw = DrainBandwidth::default();
        assert!(!bw.is_limited());
        assert!(!DrainBandwidth::new(0).is_limited(), "0 is unlimited");
        let t0 = Instant::now();
        let n = read_all(bw.throttle(Source {
            left: 100 * MB,
            chunk: 1 << 20,
        }))
        .await;
        assert_eq!(n, 100 * MB);
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_reader_does_not_poll_its_stream() {
        // The idle bound (src/drain/idle.rs) counts only the time the stream keeps the drain
        // waiting: a reader paced by its bucket must not be polling the stream meanwhile.
        struct Counting {
            polls: Arc<std::sync::atomic::AtomicUsize>,
        }
        impl AsyncRead for Counting {
            fn poll_read(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.polls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let n = buf.remaining().min(1000);
                buf.put_slice(&[1u8; 1000][..n]);
                Poll::Ready(Ok(()))
            }
        }
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bw = DrainBandwidth::new(1000);
        let mut r = bw.throttle(Counting {
            polls: Arc::clone(&polls),
        });
        let mut buf = vec![0u8; MIN_BURST as usize + 1000];
        // The first read takes the burst and a second's debt.
        let mut read = 0;
        while read < MIN_BURST as usize + 1000 {
            read += r.read(&mut buf[read..]).await.unwrap();
        }
        let before = polls.load(std::sync::atomic::Ordering::Relaxed);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut small = [0u8; 10];
        let mut rb = ReadBuf::new(&mut small);
        assert!(Pin::new(&mut r).poll_read(&mut cx, &mut rb).is_pending());
        assert_eq!(
            polls.load(std::sync::atomic::Ordering::Relaxed),
            before,
            "the stream was left alone while the reader waits"
        );
    }
}
