//! The warm pool's launcher (issue 39): the workload container of a pool pod starts parked in
//! the operator's own static binary, copied by an init container into an operator-owned emptyDir
//! mounted read-only at a fixed path and started by that absolute path (never found through
//! PATH, never a file of the image). It waits for one start message on a unix socket in another
//! operator-owned emptyDir ([`CONTROL_DIR`]), then replaces itself (`execve`) with the run's
//! command and env. The pod's user and working directory are pinned in the pod spec from the
//! template (a run that would change them never takes a pool pod: `crate::pool::compat`), so the
//! command runs as the run's user without the launcher changing identity.
//!
//! The operator delivers the message at claim time by exec'ing [`deliver`] in the workload
//! container (the container that mounts the control emptyDir; the holder need not mount it): the
//! message is read from stdin, bounded by [`MAX_START_BYTES`], and sent on the socket; the
//! launcher answers `ok` or why it refused, and a delivery with no launcher waiting fails at once. One run per pod:
//! the launcher takes the [`STARTED_MARKER`] with `O_EXCL` before it reads, and refuses to start
//! when it is already there.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The operator-owned emptyDir that holds the start socket and the started marker.
pub const CONTROL_DIR: &str = "/.sandboxrun-control";
/// The start socket's name in [`CONTROL_DIR`].
pub const START_SOCKET: &str = "start.sock";
/// The marker the launcher creates (exclusively) before it reads a start message.
pub const STARTED_MARKER: &str = "started";
/// The largest start message the launcher reads (argv and env of the run).
pub const MAX_START_BYTES: usize = 256 * 1024;
/// The most argv entries and env vars a start message may carry.
const MAX_ITEMS: usize = 4096;

/// What the launcher starts: the run's argv (command then args) and env.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartMessage {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

/// Why the launcher or a delivery refused.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("this pod has already started a run (one run per pod)")]
    AlreadyStarted,
    #[error("the start message is larger than {MAX_START_BYTES} bytes")]
    TooLarge,
    #[error("the start message is invalid: {0}")]
    Invalid(String),
    #[error("no launcher is waiting for a start message (already started, or not parked)")]
    NotWaiting,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl StartMessage {
    /// Parses and checks a start message read from the socket or stdin.
    pub fn parse(bytes: &[u8]) -> Result<Self, LaunchError> {
        if bytes.len() > MAX_START_BYTES {
            return Err(LaunchError::TooLarge);
        }
        let msg: StartMessage =
            serde_json::from_slice(bytes).map_err(|e| LaunchError::Invalid(e.to_string()))?;
        msg.check()?;
        Ok(msg)
    }

    /// The checks `execve` would otherwise fail on, with a reason that names the item.
    fn check(&self) -> Result<(), LaunchError> {
        let invalid = |s: &str| Err(LaunchError::Invalid(s.to_string()));
        if self.argv.first().is_none_or(|a| a.is_empty()) {
            return invalid("argv is empty (the run has no command)");
        }
        if self.argv.len() > MAX_ITEMS || self.env.len() > MAX_ITEMS {
            return invalid("too many argv entries or env vars");
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return invalid("an argv entry contains NUL");
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(LaunchError::Invalid(format!(
                    "env var {name:?} is not valid"
                )));
            }
        }
        Ok(())
    }
}

/// Takes the pod's one start: creates the marker exclusively, so a second launcher (a restarted
/// container) refuses.
pub fn take_the_start(control: &Path) -> Result<(), LaunchError> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(control.join(STARTED_MARKER))
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(LaunchError::AlreadyStarted),
        Err(e) => Err(e.into()),
    }
}

/// The init container's copy of the operator's own binary (`/proc/self/exe`) to `to`, readable
/// and executable, not writable.
pub fn install(to: &Path) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy("/proc/self/exe", to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o555))?;
    Ok(())
}

/// Reads at most [`MAX_START_BYTES`] + 1 bytes, so an oversized message is refused, not cut.
fn read_bounded(mut from: impl Read) -> Result<Vec<u8>, LaunchError> {
    let mut buf = Vec::new();
    from.by_ref()
        .take(MAX_START_BYTES as u64 + 1)
        .read_to_end(&mut buf)?;
    if buf.len() > MAX_START_BYTES {
        return Err(LaunchError::TooLarge);
    }
    Ok(buf)
}

/// The launcher's wait: takes the start, listens on the start socket, reads one message (the
/// sender shuts its write side), acknowledges it, stops listening and returns it (the caller
/// `exec`s it with [`exec`]). A bad message is refused to the sender and ends the launcher too:
/// the pod's one start is spent.
pub fn wait_for_start(control: &Path) -> Result<StartMessage, LaunchError> {
    take_the_start(control)?;
    let socket = control.join(START_SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    let (mut conn, _) = listener.accept()?;
    // Nobody else is heard from here on: a second delivery finds nobody waiting.
    drop(listener);
    let _ = std::fs::remove_file(&socket);
    let parsed = read_bounded(&mut conn).and_then(|bytes| StartMessage::parse(&bytes));
    let reply = match &parsed {
        Ok(_) => "ok\n".to_string(),
        Err(e) => format!("refused: {e}\n"),
    };
    let _ = conn.write_all(reply.as_bytes());
    parsed
}

/// Replaces this process with the run's command and only the run's env (plus the pod's own,
/// which the template set). Returns only on failure.
pub fn exec(msg: &StartMessage) -> LaunchError {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = msg.argv.split_first() else {
        return LaunchError::Invalid("argv is empty".into());
    };
    LaunchError::Io(
        std::process::Command::new(program)
            .args(args)
            .envs(msg.env.iter().map(|(k, v)| (k, v)))
            .exec(),
    )
}

/// Delivers a start message (read from `input`, bounded) to the launcher waiting in `control`
/// and waits for its answer. Fails at once when no launcher waits.
pub fn deliver(control: &Path, input: impl Read) -> Result<(), LaunchError> {
    let bytes = read_bounded(input)?;
    StartMessage::parse(&bytes)?;
    let mut conn = UnixStream::connect(control.join(START_SOCKET)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            LaunchError::NotWaiting
        }
        _ => LaunchError::Io(e),
    })?;
    conn.write_all(&bytes)?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    conn.take(4096).read_to_string(&mut reply)?;
    match reply.trim_end() {
        "ok" => Ok(()),
        other => Err(LaunchError::Invalid(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(argv: &[&str]) -> StartMessage {
        StartMessage {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("TASK".into(), "42".into())],
        }
    }

    #[test]
    fn a_start_message_round_trips_and_is_checked() {
        let m = msg(&["/bin/sh", "-c", "echo hi"]);
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(StartMessage::parse(&bytes).unwrap(), m);
        for bad in [msg(&[]), msg(&[""]), msg(&["a\0b"])] {
            let bytes = serde_json::to_vec(&bad).unwrap();
            assert!(matches!(
                StartMessage::parse(&bytes),
                Err(LaunchError::Invalid(_))
            ));
        }
        let mut bad_env = msg(&["/bin/true"]);
        bad_env.env = vec![("A=B".into(), "x".into())];
        let bytes = serde_json::to_vec(&bad_env).unwrap();
        assert!(matches!(
            StartMessage::parse(&bytes),
            Err(LaunchError::Invalid(_))
        ));
    }

    #[test]
    fn an_oversized_message_is_refused_not_cut() {
        let big = vec![b' '; MAX_START_BYTES + 1];
        assert!(matches!(
            StartMessage::parse(&big),
            Err(LaunchError::TooLarge)
        ));
        assert!(matches!(read_bounded(&big[..]), Err(LaunchError::TooLarge)));
    }

    #[test]
    fn a_pod_takes_one_start_only() {
        let dir = tempfile::tempdir().unwrap();
        take_the_start(dir.path()).unwrap();
        assert!(matches!(
            take_the_start(dir.path()),
            Err(LaunchError::AlreadyStarted)
        ));
        assert!(matches!(
            wait_for_start(dir.path()),
            Err(LaunchError::AlreadyStarted)
        ));
    }

    #[test]
    fn a_delivery_with_no_launcher_waiting_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = serde_json::to_vec(&msg(&["/bin/true"])).unwrap();
        assert!(matches!(
            deliver(dir.path(), &bytes[..]),
            Err(LaunchError::NotWaiting)
        ));
    }

    #[test]
    fn a_delivered_message_reaches_the_waiting_launcher_once() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().to_path_buf();
        let waiter = std::thread::spawn(move || wait_for_start(&control));
        let m = msg(&["/bin/echo", "warm"]);
        let bytes = serde_json::to_vec(&m).unwrap();
        let mut delivered = false;
        for _ in 0..200 {
            match deliver(dir.path(), &bytes[..]) {
                Ok(()) => {
                    delivered = true;
                    break;
                }
                Err(LaunchError::NotWaiting) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(delivered);
        assert_eq!(waiter.join().unwrap().unwrap(), m);
        // The launcher has its message: a second delivery finds nobody waiting.
        assert!(matches!(
            deliver(dir.path(), &bytes[..]),
            Err(LaunchError::NotWaiting)
        ));
    }
}
