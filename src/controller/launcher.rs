//! The claim's talk with a pool pod's parked launcher (`crate::inpod::launch`): the run's start
//! written to the launcher's stdin through `pods/attach`, and, for a claim resumed after a
//! restart, what the launcher did with the pod's one start (`launch-status`, an exec). I/O only:
//! what to do with the answers is the claim's (`super::warm`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::inpod::launch::{LaunchStatus, StartMessage};

/// The longest the launcher's side of a delivery (or of a status) may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the start did not reach the launcher, or its status could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum DeliveryError {
    #[error("the start message: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("attach to the parked workload: {0}")]
    Attach(#[source] kube::Error),
    #[error("the attach to the parked workload has no {0}")]
    NoStream(&'static str),
    #[error("write to the parked workload: {0}")]
    Write(#[from] std::io::Error),
    #[error("the attach to the parked workload did not end in time")]
    AttachTimeout,
    #[error("the attach to the parked workload failed: {0}")]
    AttachFailed(String),
    #[error("the attach to the parked workload ended without a status")]
    NoStatus,
    #[error("exec launch-status: {0}")]
    Exec(#[source] kube::Error),
    #[error("launch-status did not answer in time")]
    StatusTimeout,
    #[error("launch-status said nothing")]
    Silent,
}

/// Hands `message` to the pod's launcher: a fresh claim attaches to the parked workload's stdin
/// and writes it ([`attach_and_write`]: no process is spawned in the container, as an exec
/// would). A resumed claim (the run took the pod in an earlier reconcile) writes only to a
/// launcher that still waits for its start ([`deliver_if_waiting`]: the same rule as a
/// restore's hand-over). It used to write only when the launcher had no marker at all, but a
/// parked launcher takes its marker before it reads, so a claim resumed after a restart never
/// handed its start over.
pub(super) async fn deliver(
    pods: &Api<Pod>,
    pod: &str,
    message: &StartMessage,
    resumed: bool,
) -> Result<(), DeliveryError> {
    if resumed {
        return deliver_if_waiting(pods, pod, message).await;
    }
    attach_and_write(pods, pod, message).await
}

/// Hands `message` to the pod's launcher only while it waits (a restore's start or refusal,
/// docs/contract.md "Pause, resume and fork"): Ok once it took this message or an earlier one
/// (started, refused, reading); an error when its status cannot be read, so the caller tries
/// again rather than count a start that never reached it.
pub(super) async fn deliver_if_waiting(
    pods: &Api<Pod>,
    pod: &str,
    message: &StartMessage,
) -> Result<(), DeliveryError> {
    if still_waits(&launch_status(pods, pod).await?) {
        return attach_and_write(pods, pod, message).await;
    }
    Ok(())
}

/// Whether the launcher of `pod` still waits for its start (`launch-status`): nothing has run
/// in the pod yet.
pub(super) async fn still_waiting(pods: &Api<Pod>, pod: &str) -> Result<bool, DeliveryError> {
    Ok(still_waits(&launch_status(pods, pod).await?))
}

/// Whether a launcher in `status` still waits for its start: before it runs (no marker) or
/// while it reads (its marker taken and empty: a parked launcher takes it before it reads, so
/// this is every running launcher no attach has reached yet; an attach that ended closed its
/// `stdinOnce` stdin, after which the marker says what the launcher read).
fn still_waits(status: &LaunchStatus) -> bool {
    matches!(status, LaunchStatus::Waiting | LaunchStatus::Reading)
}

/// Attaches to the pod's workload container (stdin only) and writes `message` as one line of
/// JSON; Ok once the attach carried it and ended. The container's stdin is `stdinOnce`: it closes
/// when this attach ends, so the launcher never reads anything after the message.
async fn attach_and_write(
    pods: &Api<Pod>,
    pod: &str,
    message: &StartMessage,
) -> Result<(), DeliveryError> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    let params = AttachParams::default()
        .container(crate::pod::WORKLOAD_CONTAINER)
        .stdin(true)
        .stdout(false)
        .stderr(false);
    let mut attached = pods
        .attach(pod, &params)
        .await
        .map_err(DeliveryError::Attach)?;
    let mut stdin = attached.stdin().ok_or(DeliveryError::NoStream("stdin"))?;
    let status = attached
        .take_status()
        .ok_or(DeliveryError::NoStream("status"))?;
    let talk = async move {
        stdin.write_all(&line).await?;
        stdin.shutdown().await?;
        drop(stdin);
        // The kubelet ends the attach once the container's stdin took it all, with a status.
        Ok::<_, DeliveryError>(status.await)
    };
    let status = tokio::time::timeout(DELIVERY_TIMEOUT, talk)
        .await
        .map_err(|_| DeliveryError::AttachTimeout)??;
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
        Some(s) => Err(DeliveryError::AttachFailed(s.message.unwrap_or_default())),
        None => Err(DeliveryError::NoStatus),
    }
}

/// Execs `launch-status` in the pod's workload container: what its launcher did with the pod's
/// one start.
async fn launch_status(pods: &Api<Pod>, pod: &str) -> Result<LaunchStatus, DeliveryError> {
    let argv = vec![
        crate::pool::park::launcher_path(),
        "launch-status".to_string(),
    ];
    let params = AttachParams::default()
        .container(crate::pod::WORKLOAD_CONTAINER)
        .stdout(true)
        .stderr(false);
    let mut process = pods
        .exec(pod, argv, &params)
        .await
        .map_err(DeliveryError::Exec)?;
    let mut stdout = process.stdout().ok_or(DeliveryError::NoStream("stdout"))?;
    let read = async move {
        let mut said = String::new();
        let _ = (&mut stdout).take(4096).read_to_string(&mut said).await;
        said
    };
    let said = tokio::time::timeout(DELIVERY_TIMEOUT, read)
        .await
        .map_err(|_| DeliveryError::StatusTimeout)?;
    if said.trim().is_empty() {
        return Err(DeliveryError::Silent);
    }
    Ok(LaunchStatus::parse(&said))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_launcher_that_took_its_marker_and_reads_is_handed_the_start() {
        let control = tempfile::tempdir().unwrap();
        assert!(still_waits(
            &crate::inpod::launch::status(control.path()).unwrap()
        ));
        // What every running parked launcher shows: the marker taken before it reads.
        crate::inpod::launch::take_the_start(control.path()).unwrap();
        assert!(still_waits(
            &crate::inpod::launch::status(control.path()).unwrap()
        ));
        for taken in [
            LaunchStatus::Started("u1".into()),
            LaunchStatus::Refused("no".into()),
        ] {
            assert!(!still_waits(&taken), "{taken:?}");
        }
    }
}
