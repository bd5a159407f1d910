//! The transport of the drain: `sandboxrun-operator pack <path> --budget <cap>` exec'd in the
//! holder container, its stdout a tar stream (untrusted), its stderr the packer's notes, its
//! status the exit code.
//!
//! stderr is drained concurrently, to its end, into a buffer bounded in BYTES ([`collect_notes`]):
//! past the bound, and whatever the bytes are (invalid UTF-8, no newline at all), it keeps
//! reading and discarding, because an undrained stderr can stall the websocket and with it stdout
//! (a known pitfall of kube's attached processes).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess};
use kube::Api;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

use super::wire::{Wire, WIRE_FLAG};
use crate::names::HOLDER_CONTAINER;

/// Most stderr bytes kept from one pack run (the rest are read, counted and discarded).
pub(crate) const MAX_NOTE_BYTES: usize = 64 * 1024;
/// Longest stderr line kept (longer ones are cut).
const MAX_NOTE_LEN: usize = 1024;
/// How long the packer's notes are awaited once its exec was stopped.
const NOTES_AFTER_ABORT: Duration = Duration::from_secs(2);
/// The flag that passes the path's cap to the packer (`pack --budget`).
pub(crate) const BUDGET_FLAG: &str = "--budget";
/// Buffer between the websocket task and our reader; large enough not to throttle throughput.
const STDOUT_BUFFER: usize = 1024 * 1024;

/// What went wrong with the exec itself (not with the tar it carried).
#[derive(Debug, Error)]
pub(crate) enum ExecError {
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
    pub(crate) fn is_transient(&self) -> bool {
        !matches!(self, ExecError::Failed { .. })
    }

    /// Whether the packer failed because it does not know `flag` (`--budget`, `--wire`): an older
    /// holder image (or a custom `--pack-command`) whose usage error names the flag (clap:
    /// "unexpected argument '--budget'", GNU tools: "unrecognized option '--budget'").
    pub(crate) fn refuses_flag(&self, flag: &str) -> bool {
        match self {
            ExecError::Failed { stderr, .. } => stderr.iter().any(|line| line.contains(flag)),
            _ => false,
        }
    }
}

/// The packer's argv: `command... <path>`, then `--budget <bytes>` when a budget is given and
/// `--wire zstd` when the stream is to be compressed. The flags come after the path so that a
/// packer reading its path as `$1` keeps working.
pub(crate) fn pack_argv(
    command: &[String],
    path: &str,
    budget: Option<u64>,
    wire: Wire,
) -> Vec<String> {
    let mut argv: Vec<String> = command.to_vec();
    argv.push(path.to_string());
    if let Some(bytes) = budget {
        argv.push(BUDGET_FLAG.to_string());
        argv.push(bytes.to_string());
    }
    if wire != Wire::Tar {
        argv.push(WIRE_FLAG.to_string());
        argv.push(wire.as_str().to_string());
    }
    argv
}

/// A running `pack` in the holder.
pub(crate) struct PackExec {
    process: AttachedProcess,
    stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    notes: JoinHandle<PackNotes>,
    command: String,
}

/// What the packer reported besides its archive.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PackNotes {
    /// stderr lines (at most [`MAX_NOTE_BYTES`] in all, each cut to 1024 bytes, invalid UTF-8
    /// replaced), e.g. skipped special files and unreadable files.
    pub lines: Vec<String>,
    /// stderr bytes read past the bound and discarded.
    pub truncated_bytes: u64,
}

/// Reads `reader` to its end (or to a read error), keeping its first `max_bytes` bytes and
/// counting the rest. Never stops early: the writer of an exec stream must never block on a full
/// pipe. Returns the kept bytes and the number discarded.
pub(crate) async fn read_to_end_keeping<R: AsyncRead + Unpin>(
    mut reader: R,
    max_bytes: usize,
) -> (Vec<u8>, u64) {
    let mut kept: Vec<u8> = Vec::new();
    let mut discarded = 0u64;
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The stream is gone: nothing is left to drain.
            Err(_) => break,
        };
        let room = max_bytes.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
        discarded = discarded.saturating_add((n - room) as u64);
    }
    (kept, discarded)
}

/// Reads the packer's stderr to its end (see [`read_to_end_keeping`]), keeping its first
/// `max_bytes` bytes as lines and counting the rest.
pub(crate) async fn collect_notes<R: AsyncRead + Unpin>(reader: R, max_bytes: usize) -> PackNotes {
    let (kept, discarded) = read_to_end_keeping(reader, max_bytes).await;
    notes_from_bytes(&kept, discarded)
}

/// The kept stderr bytes as lines: split on `\n`, invalid UTF-8 replaced, each line cut to
/// [`MAX_NOTE_LEN`] bytes, blank lines left out.
fn notes_from_bytes(kept: &[u8], truncated_bytes: u64) -> PackNotes {
    let lines = kept
        .split(|b| *b == b'\n')
        .map(|raw| raw.strip_suffix(b"\r").unwrap_or(raw))
        .filter(|raw| !raw.is_empty())
        .map(|raw| {
            let mut line =
                String::from_utf8_lossy(&raw[..raw.len().min(MAX_NOTE_LEN)]).into_owned();
            // Replacement characters are wider than the bytes they replace.
            crate::text::truncate(&mut line, MAX_NOTE_LEN);
            line
        })
        .collect();
    PackNotes {
        lines,
        truncated_bytes,
    }
}

impl PackExec {
    /// Starts `argv` (see [`pack_argv`]) in the holder of `pod`.
    pub async fn start(
        pods: &Api<Pod>,
        pod: &str,
        argv: Vec<String>,
    ) -> Result<PackExec, ExecError> {
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
            match stderr {
                Some(stderr) => collect_notes(stderr, MAX_NOTE_BYTES).await,
                None => PackNotes::default(),
            }
        });
        Ok(PackExec {
            process,
            stdout,
            notes,
            command: argv.join(" "),
        })
    }

    /// The tar stream. Taken once.
    pub(crate) fn take_stdout(&mut self) -> Option<Box<dyn AsyncRead + Send + Unpin>> {
        self.stdout.take()
    }

    /// Waits for the exec status. Success → the packer's notes; anything else → an error that
    /// carries the exit status and the stderr tail.
    pub async fn finish(mut self) -> Result<PackNotes, ExecError> {
        let status = match self.process.take_status() {
            Some(fut) => fut.await,
            None => None,
        };
        let notes = (&mut self.notes).await.unwrap_or_default();
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

    /// Stops the exec when the drain has read all it will (the input bound), and returns what
    /// the packer said on stderr until then; its exit status is not awaited (it never finished).
    pub(crate) async fn abandon(mut self) -> PackNotes {
        self.process.abort();
        match tokio::time::timeout(NOTES_AFTER_ABORT, &mut self.notes).await {
            Ok(Ok(notes)) => notes,
            _ => {
                self.notes.abort();
                PackNotes::default()
            }
        }
    }
}

/// Renders an exec status: `exit code N` when the apiserver reports one (reason NonZeroExitCode,
/// cause ExitCode), otherwise its reason and message (kwok may report InternalError instead).
pub(crate) fn describe_status(s: &Status) -> String {
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

    /// A reader that yields `total` bytes of `pattern` in chunks, counting what was read.
    struct Noisy {
        pattern: Vec<u8>,
        left: u64,
        pos: usize,
    }

    impl AsyncRead for Noisy {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = (buf.remaining() as u64).min(self.left).min(4096) as usize;
            for _ in 0..n {
                let b = self.pattern[self.pos % self.pattern.len()];
                buf.put_slice(&[b]);
                self.pos += 1;
            }
            self.left -= n as u64;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn stderr_is_capped_by_bytes_and_read_to_its_end_through_invalid_utf8() {
        // 8 MiB of notes: invalid UTF-8, a line far longer than the line cut, then short lines.
        let mut pattern = vec![0xffu8, 0xfe, b'x'];
        pattern.extend(std::iter::repeat_n(b'y', 5000));
        pattern.extend_from_slice(b"\npack: unreadable secret: Permission denied\n");
        let total = 8 * 1024 * 1024u64;
        let mut reader = Noisy {
            pattern,
            left: total,
            pos: 0,
        };
        let notes = collect_notes(&mut reader, MAX_NOTE_BYTES).await;
        assert_eq!(reader.left, 0, "stderr was read to its end");
        assert_eq!(notes.truncated_bytes, total - MAX_NOTE_BYTES as u64);
        let kept: usize = notes.lines.iter().map(|l| l.len()).sum();
        assert!(kept <= MAX_NOTE_BYTES + 3 * notes.lines.len(), "{kept}");
        assert!(notes.lines.iter().all(|l| l.len() <= MAX_NOTE_LEN));
        assert!(
            notes.lines[0].starts_with('\u{fffd}'),
            "{:?}",
            &notes.lines[0][..8]
        );
        assert_eq!(notes.lines[1], "pack: unreadable secret: Permission denied");
    }

    #[tokio::test]
    async fn a_writer_flooding_stderr_through_a_small_pipe_never_blocks() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let chunk = [0xc3u8; 1024]; // a lone UTF-8 lead byte, over and over, no newline
            for _ in 0..4096 {
                tx.write_all(&chunk).await?;
            }
            tx.shutdown().await
        });
        let notes = tokio::time::timeout(Duration::from_secs(30), collect_notes(rx, 1000))
            .await
            .expect("the reader kept draining");
        writer
            .await
            .expect("writer task")
            .expect("the writer never blocked for good");
        assert_eq!(notes.truncated_bytes, 4096 * 1024 - 1000);
        assert_eq!(notes.lines.len(), 1);
    }

    #[test]
    fn the_flags_follow_the_path_and_a_refusal_of_each_is_recognized() {
        let cmd = vec!["sandboxrun-operator".to_string(), "pack".to_string()];
        assert_eq!(
            pack_argv(&cmd, "/out", Some(1 << 20), Wire::Tar),
            ["sandboxrun-operator", "pack", "/out", "--budget", "1048576"]
        );
        assert_eq!(
            pack_argv(&cmd, "/out", None, Wire::Tar),
            ["sandboxrun-operator", "pack", "/out"]
        );
        assert_eq!(
            pack_argv(&cmd, "/out", Some(1), Wire::Zstd),
            [
                "sandboxrun-operator",
                "pack",
                "/out",
                "--budget",
                "1",
                "--wire",
                "zstd"
            ]
        );
        assert_eq!(
            pack_argv(&cmd, "/out", Some(1), Wire::Adaptive)[3..],
            ["--budget", "1", "--wire", "adaptive"]
        );
        // A packer that knows `--wire` but not `adaptive`: clap names the flag in its refusal.
        let no_adaptive = ExecError::Failed {
            command: "pack /out --budget 1 --wire adaptive".into(),
            status: "exit code 2".into(),
            stderr: vec![
                "error: invalid value 'adaptive' for '--wire <WIRE>'".into(),
                "  [possible values: tar, zstd]".into(),
            ],
        };
        assert!(no_adaptive.refuses_flag(WIRE_FLAG));
        let no_wire = ExecError::Failed {
            command: "pack /out --budget 1 --wire zstd".into(),
            status: "exit code 2".into(),
            stderr: vec!["error: unexpected argument '--wire' found".into()],
        };
        assert!(no_wire.refuses_flag(WIRE_FLAG));
        assert!(!no_wire.refuses_flag(BUDGET_FLAG));
        let old_holder = ExecError::Failed {
            command: "pack /out --budget 1".into(),
            status: "exit code 2".into(),
            stderr: vec![
                "error: unexpected argument '--budget' found".into(),
                "Usage: sandboxrun-operator pack <PATH>".into(),
            ],
        };
        assert!(old_holder.refuses_flag(BUDGET_FLAG));
        let other = ExecError::Failed {
            command: "pack /out --budget 1".into(),
            status: "exit code 1".into(),
            stderr: vec!["sandboxrun-operator pack: read-back path /out is not a directory".into()],
        };
        assert!(!other.refuses_flag(BUDGET_FLAG));
        assert!(!ExecError::NoStatus {
            command: "pack".into()
        }
        .refuses_flag(BUDGET_FLAG));
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
