//! The transport of the drain: `sandboxrun-operator pack <path>` exec'd in the holder container,
//! its stdout a tar stream (untrusted), its stderr the packer's notes, its status the exit code.
//!
//! stderr is drained concurrently into a bounded buffer: an undrained stderr can stall the
//! websocket and with it stdout (CRATES.md pitfall).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess};
use kube::Api;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;

use crate::pod::HOLDER_CONTAINER;

/// Most stderr lines kept from one pack run (the rest are counted, not kept).
const MAX_NOTE_LINES: usize = 1000;
/// Longest stderr line kept (longer ones are cut).
const MAX_NOTE_LEN: usize = 1024;
/// Buffer between the websocket task and our reader; large enough not to throttle throughput.
const STDOUT_BUFFER: usize = 1024 * 1024;

/// What went wrong with the exec itself (not with the tar it carried).
#[derive(Debug, Error)]
pub enum ExecError {
    /// The exec could not be started (pod gone, holder not running, RBAC, apiserver down…).
    #[error("could not exec into {pod}/{container}: {source}")]
    Start {
        /// Pod name.
        pod: String,
        /// Container name.
        container: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The command ran and failed.
    #[error("`{command}` in the holder failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        /// The command line.
        command: String,
        /// The exec status in words (exit code when the apiserver reports one).
        status: String,
        /// The last lines the command wrote on stderr.
        stderr: Vec<String>,
    },
    /// The stream ended without an exec status: the connection broke.
    #[error("the exec stream of `{command}` ended without a status (connection lost)")]
    NoStatus {
        /// The command line.
        command: String,
    },
}

fn stderr_suffix(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        let tail: Vec<&str> = lines
            .iter()
            .rev()
            .take(3)
            .rev()
            .map(String::as_str)
            .collect();
        format!(": {}", tail.join(" | "))
    }
}

impl ExecError {
    /// Whether another attempt may succeed (a broken connection) rather than repeat the same
    /// failure (the packer refused the path).
    pub fn is_transient(&self) -> bool {
        !matches!(self, ExecError::Failed { .. })
    }
}

/// A running `pack` in the holder.
pub struct PackExec {
    process: AttachedProcess,
    stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    notes: JoinHandle<(Vec<String>, usize)>,
    command: String,
}

/// What the packer reported besides its archive.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackNotes {
    /// stderr lines (bounded), e.g. skipped special files and unreadable files.
    pub lines: Vec<String>,
    /// Lines not kept because of the bound.
    pub truncated: usize,
}

impl PackExec {
    /// Starts `command... <path>` in the holder of `pod`.
    pub async fn start(
        pods: &Api<Pod>,
        pod: &str,
        command: &[String],
        path: &str,
    ) -> Result<PackExec, ExecError> {
        let mut argv: Vec<String> = command.to_vec();
        argv.push(path.to_string());
        let mut params = AttachParams::default()
            .container(HOLDER_CONTAINER)
            .stdin(false)
            .stdout(true)
            .stderr(true);
        params.max_stdout_buf_size = Some(STDOUT_BUFFER);
        let mut process = pods
            .exec(pod, argv.clone(), &params)
            .await
            .map_err(|source| ExecError::Start {
                pod: pod.to_string(),
                container: HOLDER_CONTAINER.to_string(),
                source,
            })?;
        let stdout = process
            .stdout()
            .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>);
        let stderr = process.stderr();
        let notes = tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut dropped = 0usize;
            if let Some(stderr) = stderr {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(mut line)) = lines.next_line().await {
                    if kept.len() >= MAX_NOTE_LINES {
                        dropped += 1;
                        continue;
                    }
                    if line.len() > MAX_NOTE_LEN {
                        let mut cut = MAX_NOTE_LEN;
                        while !line.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        line.truncate(cut);
                    }
                    kept.push(line);
                }
            }
            (kept, dropped)
        });
        Ok(PackExec {
            process,
            stdout,
            notes,
            command: argv.join(" "),
        })
    }

    /// The tar stream. Taken once.
    pub fn take_stdout(&mut self) -> Option<Box<dyn AsyncRead + Send + Unpin>> {
        self.stdout.take()
    }

    /// Waits for the exec status. Success → the packer's notes; anything else → an error that
    /// carries the exit status and the stderr tail.
    pub async fn finish(mut self) -> Result<PackNotes, ExecError> {
        let status = match self.process.take_status() {
            Some(fut) => fut.await,
            None => None,
        };
        let (lines, truncated) = (&mut self.notes).await.unwrap_or_default();
        let notes = PackNotes { lines, truncated };
        match status {
            Some(s) if s.status.as_deref() == Some("Success") => Ok(notes),
            Some(s) => Err(ExecError::Failed {
                command: self.command.clone(),
                status: describe_status(&s),
                stderr: notes.lines,
            }),
            None => Err(ExecError::NoStatus {
                command: self.command.clone(),
            }),
        }
    }

    /// Stops the exec (e.g. the stream was refused mid-way); the holder sees a closed pipe.
    pub fn abort(&self) {
        self.process.abort();
    }
}

/// Renders an exec status: `exit code N` when the apiserver reports one (reason NonZeroExitCode,
/// cause ExitCode), otherwise its reason and message (kwok may report InternalError instead).
pub fn describe_status(s: &Status) -> String {
    match exit_code(s) {
        Some(code) => format!("exit code {code}"),
        None => format!(
            "{}: {}",
            s.reason.as_deref().unwrap_or("Failure"),
            s.message.as_deref().unwrap_or("no message")
        ),
    }
}

/// The exit code in an exec status, when it carries one.
///
/// A kubelet reports `Failure` / `NonZeroExitCode` with the code in `details.causes[ExitCode]`.
/// kwok v0.8 (the test bed's node) reports `InternalError` with a message ending in
/// `exit status N` instead; that form is read too, so both say "exit code N".
pub fn exit_code(s: &Status) -> Option<i32> {
    if s.status.as_deref() == Some("Success") {
        return Some(0);
    }
    let from_cause = s
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.trim().parse().ok());
    from_cause.or_else(|| {
        let message = s.message.as_deref()?;
        let (_, tail) = message.rsplit_once("exit status ")?;
        tail.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn exit_codes_are_read_from_the_status_causes() {
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("2".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(&failed), Some(2));
        assert_eq!(describe_status(&failed), "exit code 2");
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&ok), Some(0));
        let internal = Status {
            status: Some("Failure".into()),
            reason: Some("InternalError".into()),
            message: Some("exit status 3".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&internal), Some(3), "kwok's form");
        assert_eq!(describe_status(&internal), "exit code 3");
        let opaque = Status {
            status: Some("Failure".into()),
            message: Some("boom".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&opaque), None);
        assert_eq!(describe_status(&opaque), "Failure: boom");
    }

    #[test]
    fn a_failed_pack_is_not_transient_a_lost_stream_is() {
        let failed = ExecError::Failed {
            command: "pack".into(),
            status: "exit code 2".into(),
            stderr: vec![],
        };
        assert!(!failed.is_transient());
        assert!(ExecError::NoStatus {
            command: "pack".into()
        }
        .is_transient());
    }
}
