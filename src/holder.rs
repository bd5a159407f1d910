//! The holder container's modes. The holder exists because exec into a terminated container is
//! impossible: it idles beside the workload with every read-back emptyDir mounted, so the drain can
//! exec `pack` into it after the workload exited, and no user image needs `tar`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File whose presence says "the operator has drained this pod".
pub const DRAINED_MARKER: &str = "drained";

/// Writes the drained marker (the operator execs this after the drain).
pub fn mark_drained(state_dir: &Path) -> std::io::Result<PathBuf> {
    let marker = state_dir.join(DRAINED_MARKER);
    std::fs::write(&marker, b"drained\n")?;
    Ok(marker)
}

/// The preStop hook: waits until the marker exists or `timeout` passes. Returns whether the
/// marker appeared. Either way the hook then returns and the kubelet stops the container: a hook
/// that never returned would only be killed at the end of the grace period anyway.
pub async fn wait_drained(state_dir: &Path, timeout: Duration) -> bool {
    let marker = state_dir.join(DRAINED_MARKER);
    let start = Instant::now();
    loop {
        if marker.exists() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Idles until SIGTERM/SIGINT. The holder does nothing else: the drain comes to it by exec.
pub async fn idle() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn prestop_returns_once_the_operator_marks_the_pod_drained() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!wait_drained(dir.path(), Duration::from_millis(300)).await);
        let path = dir.path().to_path_buf();
        let waiter =
            tokio::spawn(async move { wait_drained(&path, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        mark_drained(dir.path()).unwrap();
        assert!(waiter.await.unwrap());
    }
}
