//! The claim's talk with a pool pod's parked launcher (`crate::inpod::launch`), the words of it
//! and its rules: the run's start as one line of JSON written to the launcher's stdin through
//! `pods/attach`, and the `launch-status` exec that says what the launcher did with the pod's
//! one start; a start is written only to a launcher that still waits for it. No I/O: act carries
//! the talk out ([`Talk`], `super::act::Parked`), for the claim's `HandPoolStart` and the
//! restore's effects; what follows its answer is planned (`super::plan::claim`,
//! `super::plan::restore`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachParams;

use crate::inpod::launch::{LaunchStatus, StartMessage};

/// The longest the launcher's side of a delivery (or of a status) may take.
pub(super) const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of `launch-status`'s output read.
pub(super) const STATUS_LIMIT: u64 = 4096;

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

/// The two things said to a parked launcher, carried out by act (`super::act::Parked`): ask
/// what it did with the pod's one start, and write it the start.
pub(super) trait Talk {
    /// Execs `launch-status` in the pod's workload container ([`status_argv`]).
    async fn status(&self, pod: &str) -> Result<LaunchStatus, DeliveryError>;
    /// Attaches to the pod's workload container (stdin only) and writes `message` as one line
    /// ([`start_line`]); Ok once the attach carried it and ended ([`attach_ended`]).
    async fn write(&self, pod: &str, message: &StartMessage) -> Result<(), DeliveryError>;
}

/// Hands `message` to the pod's launcher: a fresh claim attaches to the parked workload's stdin
/// and writes it (no process is spawned in the container, as an exec would). A resumed claim
/// (the run took the pod in an earlier reconcile) writes only to a launcher that still waits for
/// its start ([`deliver_if_waiting`]: the same rule as a restore's hand-over). It used to write
/// only when the launcher had no marker at all, but a parked launcher takes its marker before it
/// reads, so a claim resumed after a restart never handed its start over.
pub(super) async fn deliver(
    talk: &impl Talk,
    pod: &str,
    message: &StartMessage,
    resumed: bool,
) -> Result<(), DeliveryError> {
    if resumed {
        return deliver_if_waiting(talk, pod, message).await;
    }
    talk.write(pod, message).await
}

/// Hands `message` to the pod's launcher only while it waits (a restore's start or refusal,
/// docs/contract.md "Pause, resume and fork"): Ok once it took this message or an earlier one
/// (started, refused, reading); an error when its status cannot be read, so the caller tries
/// again rather than count a start that never reached it.
pub(super) async fn deliver_if_waiting(
    talk: &impl Talk,
    pod: &str,
    message: &StartMessage,
) -> Result<(), DeliveryError> {
    if still_waits(&talk.status(pod).await?) {
        return talk.write(pod, message).await;
    }
    Ok(())
}

/// Whether the launcher of `pod` still waits for its start (`launch-status`): nothing has run
/// in the pod yet.
pub(super) async fn still_waiting(talk: &impl Talk, pod: &str) -> Result<bool, DeliveryError> {
    Ok(still_waits(&talk.status(pod).await?))
}

/// Whether a launcher in `status` still waits for its start: before it runs (no marker) or
/// while it reads (its marker taken and empty: a parked launcher takes it before it reads, so
/// this is every running launcher no attach has reached yet; an attach that ended closed its
/// `stdinOnce` stdin, after which the marker says what the launcher read).
fn still_waits(status: &LaunchStatus) -> bool {
    matches!(status, LaunchStatus::Waiting | LaunchStatus::Reading)
}

/// The bytes of `message` as the launcher reads it: one line of JSON.
pub(super) fn start_line(message: &StartMessage) -> Result<Vec<u8>, DeliveryError> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}

/// The attach that writes the start: the workload container's stdin only. The container's
/// stdin is `stdinOnce`: it closes when this attach ends, so the launcher never reads anything
/// after the message.
pub(super) fn attach_params() -> AttachParams {
    AttachParams::default()
        .container(crate::pod::WORKLOAD_CONTAINER)
        .stdin(true)
        .stdout(false)
        .stderr(false)
}

/// What the attach's ending `status` says of the delivery.
pub(super) fn attach_ended(status: Option<Status>) -> Result<(), DeliveryError> {
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
        Some(s) => Err(DeliveryError::AttachFailed(s.message.unwrap_or_default())),
        None => Err(DeliveryError::NoStatus),
    }
}

/// The argv of the exec that asks the launcher what it did with the pod's one start.
pub(super) fn status_argv() -> Vec<String> {
    vec![
        crate::pool::park::launcher_path(),
        "launch-status".to_string(),
    ]
}

/// The `launch-status` exec: the workload container's stdout only.
pub(super) fn status_params() -> AttachParams {
    AttachParams::default()
        .container(crate::pod::WORKLOAD_CONTAINER)
        .stdout(true)
        .stderr(false)
}

/// What `launch-status` said (`said`: its stdout, at most [`STATUS_LIMIT`] bytes).
pub(super) fn status_said(said: &str) -> Result<LaunchStatus, DeliveryError> {
    if said.trim().is_empty() {
        return Err(DeliveryError::Silent);
    }
    Ok(LaunchStatus::parse(said))
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
