//! Relaying an allowed connection: bytes are copied both ways as they come (fixed 8 KiB buffers,
//! no body is held), and a connection on which no byte moved in either direction for the idle
//! timeout is closed, so a tunnel cannot hold a slot while doing nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

const BUFFER: usize = 8 * 1024;

/// How a relay ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Both sides closed their half.
    Closed,
    /// No byte moved for the idle timeout.
    Idle,
}

/// Milliseconds since `start` at the last byte moved.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

async fn pump<R, W>(mut from: R, mut to: W, activity: &Activity) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // Half-close: the other direction goes on.
            let _ = to.shutdown().await;
            return Ok(());
        }
        activity.touch();
        to.write_all(&buf[..n]).await?;
        activity.touch();
    }
}

/// Resolves once nothing moved for `idle` (never, when `idle` is beyond the clock's range).
async fn idle_watch(activity: &Activity, idle: Duration) {
    loop {
        let Some(deadline) = activity.last().checked_add(idle) else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(deadline).await;
        if activity
            .last()
            .checked_add(idle)
            .is_some_and(|d| d <= Instant::now())
        {
            return;
        }
    }
}

/// Copies `a` ↔ `b` (each given as its read and write halves) until both directions end, an I/O
/// error, or `idle` without a byte in either direction.
pub(crate) async fn relay<AR, AW, BR, BW>(
    (a_read, a_write): (AR, AW),
    (b_read, b_write): (BR, BW),
    idle: Duration,
) -> std::io::Result<Ended>
where
    AR: AsyncRead + Unpin,
    AW: AsyncWrite + Unpin,
    BR: AsyncRead + Unpin,
    BW: AsyncWrite + Unpin,
{
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let both = async {
        let (up, down) = tokio::join!(
            pump(a_read, b_write, &activity),
            pump(b_read, a_write, &activity)
        );
        up.and(down)
    };
    tokio::select! {
        r = both => r.map(|()| Ended::Closed),
        () = idle_watch(&activity, idle) => Ok(Ended::Idle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_quiet_tunnel_is_closed_after_the_idle_timeout() {
        let (client, proxy_side) = tokio::io::duplex(1024);
        let (upstream_side, upstream) = tokio::io::duplex(1024);
        let idle = Duration::from_secs(300);
        let relayed = tokio::spawn(async move {
            relay(
                tokio::io::split(proxy_side),
                tokio::io::split(upstream_side),
                idle,
            )
            .await
        });
        let (mut c_read, mut c_write) = tokio::io::split(client);
        let (mut u_read, mut u_write) = tokio::io::split(upstream);
        // Traffic keeps it open past the timeout.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(200)).await;
            c_write.write_all(b"ping").await.ok();
            let mut b = [0u8; 4];
            u_read.read_exact(&mut b).await.ok();
            u_write.write_all(b"pong").await.ok();
            c_read.read_exact(&mut b).await.ok();
            assert_eq!(&b, b"pong");
        }
        assert!(
            !relayed.is_finished(),
            "600 s of traffic, never 300 s quiet"
        );
        tokio::time::sleep(Duration::from_secs(301)).await;
        // Bounded: a relay that never ends fails the test instead of hanging it.
        let ended = tokio::time::timeout(Duration::from_secs(10), relayed)
            .await
            .map_err(|_| "still open 10 s after the idle timeout".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        assert!(
            matches!(ended, Ok(Ok(Ended::Idle))),
            "quiet for 301 s: {ended:?}"
        );
        let mut b = [0u8; 1];
        assert_eq!(
            c_read.read(&mut b).await.ok(),
            Some(0),
            "the client sees EOF"
        );
    }

    #[tokio::test]
    async fn both_halves_close_the_relay() {
        let (client, proxy_side) = tokio::io::duplex(1024);
        let (upstream_side, upstream) = tokio::io::duplex(1024);
        let relayed = tokio::spawn(relay(
            tokio::io::split(proxy_side),
            tokio::io::split(upstream_side),
            Duration::from_secs(60),
        ));
        let (mut c_read, mut c_write) = tokio::io::split(client);
        let (mut u_read, mut u_write) = tokio::io::split(upstream);
        c_write.write_all(b"hello").await.ok();
        c_write.shutdown().await.ok();
        let mut got = Vec::new();
        u_read.read_to_end(&mut got).await.ok();
        assert_eq!(got, b"hello", "the client's half-close reaches upstream");
        u_write.write_all(b"bye").await.ok();
        u_write.shutdown().await.ok();
        let mut back = Vec::new();
        c_read.read_to_end(&mut back).await.ok();
        assert_eq!(
            back, b"bye",
            "the other direction went on after the half-close"
        );
        let ended = relayed.await.map_err(|e| e.to_string());
        assert!(matches!(ended, Ok(Ok(Ended::Closed))), "{ended:?}");
    }
}
