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
/// this is every running launcher no start has reached yet; once it read its line, the marker
/// says what it read).
fn still_waits(status: &LaunchStatus) -> bool {
    matches!(status, LaunchStatus::Waiting | LaunchStatus::Reading)
}

/// The bytes of `message` as the launcher reads it: one line of JSON.
pub(super) fn start_line(message: &StartMessage) -> Result<Vec<u8>, DeliveryError> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}

/// The attach that writes the start (or is held open to write it: `crate::pool::hold`): the
/// workload container's stdin only. The launcher reads one line and gives the workload
/// `/dev/null`, so nothing written after the message reaches the run.
pub(crate) fn attach_params() -> AttachParams {
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
    use std::cell::RefCell;

    use super::*;

    /// A launcher that answers `launch-status` with `status` (None: the exec fails) and takes
    /// every write (`write_fails`: the attach fails); it records what it was told.
    struct Launcher {
        status: Option<LaunchStatus>,
        write_fails: bool,
        asked: RefCell<Vec<String>>,
        written: RefCell<Vec<(String, StartMessage)>>,
    }

    impl Launcher {
        fn answering(status: Option<LaunchStatus>) -> Launcher {
            Launcher {
                status,
                write_fails: false,
                asked: RefCell::new(Vec::new()),
                written: RefCell::new(Vec::new()),
            }
        }

        fn asked(&self) -> usize {
            self.asked.borrow().len()
        }

        fn written(&self) -> Vec<(String, StartMessage)> {
            self.written.borrow().clone()
        }
    }

    impl Talk for Launcher {
        async fn status(&self, pod: &str) -> Result<LaunchStatus, DeliveryError> {
            self.asked.borrow_mut().push(pod.to_string());
            self.status.clone().ok_or(DeliveryError::StatusTimeout)
        }

        async fn write(&self, pod: &str, message: &StartMessage) -> Result<(), DeliveryError> {
            if self.write_fails {
                return Err(DeliveryError::AttachTimeout);
            }
            self.written
                .borrow_mut()
                .push((pod.to_string(), message.clone()));
            Ok(())
        }
    }

    fn start() -> StartMessage {
        StartMessage {
            run: "uid-1".into(),
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            env: vec![("A".into(), "1".into())],
            refuse: None,
        }
    }

    /// Every answer `launch-status` can give, and whether the launcher still waits then.
    fn every_status() -> Vec<(LaunchStatus, bool)> {
        vec![
            (LaunchStatus::Waiting, true),
            (LaunchStatus::Reading, true),
            (LaunchStatus::Started("uid-1".into()), false),
            (LaunchStatus::Started("uid-2".into()), false),
            (LaunchStatus::Refused("restore failed".into()), false),
        ]
    }

    #[tokio::test]
    async fn a_fresh_claim_writes_its_start_without_asking_the_launcher() {
        let launcher = Launcher::answering(Some(LaunchStatus::Started("uid-0".into())));
        deliver(&launcher, "pool-x1", &start(), false)
            .await
            .unwrap();
        assert_eq!(launcher.asked(), 0);
        assert_eq!(launcher.written(), vec![("pool-x1".to_string(), start())]);
    }

    #[tokio::test]
    async fn a_resumed_claim_and_a_restore_write_only_to_a_launcher_that_still_waits() {
        for (status, waits) in every_status() {
            let resumed = Launcher::answering(Some(status.clone()));
            deliver(&resumed, "pool-x1", &start(), true).await.unwrap();
            let restore = Launcher::answering(Some(status.clone()));
            deliver_if_waiting(&restore, "pool-x1", &start())
                .await
                .unwrap();
            for launcher in [&resumed, &restore] {
                assert_eq!(launcher.asked(), 1, "{status:?}");
                let want = if waits {
                    vec![("pool-x1".to_string(), start())]
                } else {
                    Vec::new()
                };
                assert_eq!(launcher.written(), want, "{status:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_launcher_whose_status_cannot_be_read_is_never_counted_as_handed_its_start() {
        let launcher = Launcher::answering(None);
        let resumed = deliver(&launcher, "pool-x1", &start(), true).await;
        assert!(
            matches!(resumed, Err(DeliveryError::StatusTimeout)),
            "{resumed:?}"
        );
        let restore = deliver_if_waiting(&launcher, "pool-x1", &start()).await;
        assert!(
            matches!(restore, Err(DeliveryError::StatusTimeout)),
            "{restore:?}"
        );
        let waiting = still_waiting(&launcher, "pool-x1").await;
        assert!(
            matches!(waiting, Err(DeliveryError::StatusTimeout)),
            "{waiting:?}"
        );
        assert_eq!(launcher.written(), Vec::new());
    }

    #[tokio::test]
    async fn a_write_that_fails_is_the_deliverys_error() {
        for resumed in [false, true] {
            let mut launcher = Launcher::answering(Some(LaunchStatus::Waiting));
            launcher.write_fails = true;
            let delivered = deliver(&launcher, "pool-x1", &start(), resumed).await;
            assert!(
                matches!(delivered, Err(DeliveryError::AttachTimeout)),
                "resumed {resumed}: {delivered:?}"
            );
        }
    }

    #[tokio::test]
    async fn still_waiting_is_what_the_launchers_status_says() {
        for (status, waits) in every_status() {
            let launcher = Launcher::answering(Some(status.clone()));
            assert_eq!(
                still_waiting(&launcher, "pool-x1").await.unwrap(),
                waits,
                "{status:?}"
            );
            assert_eq!(launcher.written(), Vec::new(), "asking writes nothing");
        }
    }

    #[test]
    fn the_start_is_one_line_of_json_the_launcher_reads_back() {
        let refusal = StartMessage::refusal("uid-1", "the restore failed:\nsha mismatch");
        for message in [start(), refusal] {
            let line = start_line(&message).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let body = &line[..line.len() - 1];
            assert!(
                !body.contains(&b'\n'),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
            let read: StartMessage = serde_json::from_slice(body).unwrap();
            assert_eq!(read, message);
        }
        let line = start_line(&start()).unwrap();
        assert_eq!(
            StartMessage::parse(&line[..line.len() - 1]).ok(),
            Some(start())
        );
    }

    #[test]
    fn the_start_is_written_to_the_workloads_stdin_only_and_the_status_read_from_its_stdout_only() {
        let attach = attach_params();
        let workload = Some(crate::pod::WORKLOAD_CONTAINER.to_string());
        assert_eq!(attach.container, workload);
        assert_eq!(
            (attach.stdin, attach.stdout, attach.stderr, attach.tty),
            (true, false, false, false)
        );
        let status = status_params();
        assert_eq!(status.container, workload);
        assert_eq!(
            (status.stdin, status.stdout, status.stderr, status.tty),
            (false, true, false, false)
        );
        let argv = status_argv();
        assert_eq!(
            argv,
            [crate::pool::park::launcher_path(), "launch-status".into()]
        );
        assert!(argv[0].starts_with('/'), "by absolute path, never PATH");
    }

    #[test]
    fn only_an_attach_that_ended_in_success_delivered_the_start() {
        let ended = |status: &str, message: Option<&str>| {
            attach_ended(Some(Status {
                status: Some(status.into()),
                message: message.map(str::to_string),
                ..Status::default()
            }))
        };
        assert!(ended("Success", None).is_ok());
        let failed = ended("Failure", Some("container not running"));
        assert!(
            matches!(&failed, Err(DeliveryError::AttachFailed(m)) if m == "container not running"),
            "{failed:?}"
        );
        let bare = ended("Failure", None);
        assert!(
            matches!(&bare, Err(DeliveryError::AttachFailed(m)) if m.is_empty()),
            "{bare:?}"
        );
        let unnamed = attach_ended(Some(Status::default()));
        assert!(
            matches!(unnamed, Err(DeliveryError::AttachFailed(_))),
            "{unnamed:?}"
        );
        let silent = attach_ended(None);
        assert!(matches!(silent, Err(DeliveryError::NoStatus)), "{silent:?}");
    }

    #[test]
    fn launch_status_says_what_the_launcher_did_and_silence_is_an_error() {
        for said in ["", "  \n", "\n"] {
            let got = status_said(said);
            assert!(
                matches!(got, Err(DeliveryError::Silent)),
                "{said:?}: {got:?}"
            );
        }
        for (status, _) in every_status() {
            let said = format!("{}\n", status.line());
            assert_eq!(status_said(&said).unwrap(), status, "{said:?}");
        }
    }

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
