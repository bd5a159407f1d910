//! The warm pool's launcher (issue 39): the workload container of a pool pod starts parked in
//! the operator's own static binary, copied by an init container into an operator-owned emptyDir
//! mounted read-only at a fixed path and started by that absolute path (never found through
//! PATH, never a file of the image). It reads one start message — one line of JSON — from its
//! stdin, then replaces itself (`execve`) with the run's command and env, its stdin `/dev/null`
//! as a cold run's. The pod's user and working directory are pinned in the pod spec from the
//! template (a run that would change them never takes a pool pod: `crate::pool::compat`), so the
//! command runs as the run's user without the launcher changing identity.
//!
//! The operator delivers the message at claim time through `pods/attach` to the workload
//! container's stdin (`stdin: true`; not `stdinOnce`, so an attach held open ahead of the claim
//! that ends unused leaves it open: `crate::pool::hold`); the launcher reads one line and
//! `execve`s with stdin `/dev/null`, so nothing written after reaches the run. No process is
//! spawned in the container, which an exec would do. One run per pod: the launcher takes the [`STARTED_MARKER`] in another
//! operator-owned emptyDir ([`CONTROL_DIR`]) with `O_EXCL` before it reads, and refuses to start
//! when it is already there; it then writes into the marker whose start it took
//! (`started <run uid>`) or why it refused, which `launch-status` prints ([`status`]): a claim
//! resumed after a restart reads it to tell "not delivered yet" from "this run's start".

use std::io::{BufRead, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The operator-owned emptyDir that holds the started marker.
pub const CONTROL_DIR: &str = "/.sandboxrun-control";
/// The marker the launcher creates (exclusively) before it reads a start message.
pub const STARTED_MARKER: &str = "started";
/// The largest start message the launcher reads (argv and env of the run).
pub const MAX_START_BYTES: usize = 256 * 1024;
/// The most argv entries and env vars a start message may carry.
const MAX_ITEMS: usize = 4096;

/// What the launcher starts: the run's argv (command then args) and env, for the run `run`
/// (its uid, written into the marker).
/// Its `Debug` names the env vars, never their values: a warm claim delivers values read from
/// Secrets (docs/contract.md "A warm run's env from Secrets and ConfigMaps").
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartMessage {
    #[serde(default)]
    pub run: String,
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Set: the operator refuses the start (a restore failed, docs/contract.md "Pause, resume
    /// and fork"): the launcher runs nothing and exits 127 with this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refuse: Option<String>,
}

impl std::fmt::Debug for StartMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("StartMessage")
            .field("run", &self.run)
            .field("argv", &self.argv)
            .field("env (names only)", &env)
            .field("refuse", &self.refuse)
            .finish()
    }
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
    #[error("the start message ended before its end of line")]
    Unterminated,
    #[error("the operator refused the start: {0}")]
    RefusedByOperator(String),
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

    /// The message that refuses the start of run `run` (why): nothing is run.
    pub fn refusal(run: &str, why: &str) -> StartMessage {
        StartMessage {
            run: run.to_string(),
            argv: Vec::new(),
            env: Vec::new(),
            refuse: Some(why.chars().take(4096).collect()),
        }
    }

    /// The checks `execve` would otherwise fail on, with a reason that names the item; a
    /// refusal is refused.
    fn check(&self) -> Result<(), LaunchError> {
        if let Some(why) = &self.refuse {
            return Err(LaunchError::RefusedByOperator(why.clone()));
        }
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

/// Reads one line of at most [`MAX_START_BYTES`] bytes (its end of line not counted), so an
/// oversized message is refused, not cut; a stream that ends before the end of line is refused.
fn read_line_bounded(from: impl Read) -> Result<Vec<u8>, LaunchError> {
    let mut buf = Vec::new();
    std::io::BufReader::new(from.take(MAX_START_BYTES as u64 + 1)).read_until(b'\n', &mut buf)?;
    match buf.pop() {
        Some(b'\n') => Ok(buf),
        _ if buf.len() >= MAX_START_BYTES => Err(LaunchError::TooLarge),
        _ => Err(LaunchError::Unterminated),
    }
}

/// The launcher's wait: takes the start, reads one message from `stdin`, writes into the marker
/// whose start it took (or why it refused) and returns it (the caller `exec`s it with [`exec`]).
/// A bad message ends the launcher too: the pod's one start is spent.
pub fn wait_for_start(control: &Path, stdin: impl Read) -> Result<StartMessage, LaunchError> {
    take_the_start(control)?;
    let parsed = read_line_bounded(stdin).and_then(|bytes| StartMessage::parse(&bytes));
    let said = match &parsed {
        Ok(msg) => format!("{STARTED} {}\n", msg.run),
        Err(e) => format!("refused: {e}\n"),
    };
    std::fs::OpenOptions::new()
        .write(true)
        .open(control.join(STARTED_MARKER))?
        .write_all(said.as_bytes())?;
    parsed
}

/// The first word of the marker of a start the launcher took.
const STARTED: &str = "started";

/// Replaces this process with the run's command and only the run's env (plus the pod's own,
/// which the template set), its stdin `/dev/null`. Returns only on failure.
pub fn exec(msg: &StartMessage) -> LaunchError {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = msg.argv.split_first() else {
        return LaunchError::Invalid("argv is empty".into());
    };
    LaunchError::Io(
        std::process::Command::new(program)
            .args(args)
            .envs(msg.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .exec(),
    )
}

/// What the launcher of `control` did with the pod's one start, as the operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchStatus {
    /// No start taken yet: the launcher waits (or has not begun).
    Waiting,
    /// The start is taken and the message not read yet.
    Reading,
    /// The run of this uid was started.
    Started(String),
    /// The start was refused, for this reason.
    Refused(String),
}

impl LaunchStatus {
    /// The status `launch-status` prints (and [`LaunchStatus::parse`] reads back).
    pub fn line(&self) -> String {
        match self {
            LaunchStatus::Waiting => "waiting".into(),
            LaunchStatus::Reading => "reading".into(),
            LaunchStatus::Started(run) => format!("{STARTED} {run}"),
            LaunchStatus::Refused(why) => format!("refused: {why}"),
        }
    }

    /// Reads a line [`LaunchStatus::line`] printed.
    pub fn parse(line: &str) -> LaunchStatus {
        let line = line.trim();
        if let Some(run) = line.strip_prefix(STARTED).and_then(|r| r.strip_prefix(' ')) {
            return LaunchStatus::Started(run.to_string());
        }
        match line {
            "waiting" => LaunchStatus::Waiting,
            "reading" | "" => LaunchStatus::Reading,
            other => {
                LaunchStatus::Refused(other.strip_prefix("refused: ").unwrap_or(other).to_string())
            }
        }
    }
}

/// What the marker of `control` says (`launch-status`).
pub fn status(control: &Path) -> Result<LaunchStatus, LaunchError> {
    let mut said = String::new();
    match std::fs::File::open(control.join(STARTED_MARKER)) {
        Ok(f) => f.take(4096).read_to_string(&mut said)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LaunchStatus::Waiting),
        Err(e) => return Err(e.into()),
    };
    Ok(LaunchStatus::parse(&said))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(argv: &[&str]) -> StartMessage {
        StartMessage {
            run: "uid-1".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("TASK".into(), "42".into())],
            refuse: None,
        }
    }

    #[test]
    fn a_start_messages_debug_names_its_env_and_never_shows_a_value() {
        let mut m = msg(&["/bin/sh"]);
        m.env.push(("TOKEN".into(), "s3cr3t-from-a-secret".into()));
        let shown = format!("{m:?}");
        assert!(shown.contains("TOKEN") && shown.contains("TASK"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("42"),
            "{shown}"
        );
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

    fn line(m: &StartMessage) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(m).unwrap();
        bytes.push(b'\n');
        bytes
    }

    #[test]
    fn an_oversized_or_unterminated_message_is_refused_not_cut() {
        let big = vec![b' '; MAX_START_BYTES + 1];
        assert!(matches!(
            StartMessage::parse(&big),
            Err(LaunchError::TooLarge)
        ));
        assert!(matches!(
            read_line_bounded(&big[..]),
            Err(LaunchError::TooLarge)
        ));
        let mut just = vec![b' '; MAX_START_BYTES];
        just.push(b'\n');
        assert_eq!(read_line_bounded(&just[..]).unwrap().len(), MAX_START_BYTES);
        assert!(matches!(
            read_line_bounded(&b"{\"argv\":[\"/bin/true\"]}"[..]),
            Err(LaunchError::Unterminated)
        ));
    }

    #[test]
    fn a_refused_start_runs_nothing_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let m = StartMessage::refusal("uid-1", "sha mismatch");
        let err = wait_for_start(dir.path(), &line(&m)[..]).unwrap_err();
        assert!(matches!(err, LaunchError::RefusedByOperator(ref w) if w == "sha mismatch"));
        assert_eq!(
            status(dir.path()).unwrap(),
            LaunchStatus::Refused("the operator refused the start: sha mismatch".into())
        );
    }

    #[test]
    fn a_pod_takes_one_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let m = msg(&["/bin/echo", "warm"]);
        assert_eq!(status(dir.path()).unwrap(), LaunchStatus::Waiting);
        // One line is read; what follows it on stdin is never the launcher's.
        let mut input = line(&m);
        input.extend_from_slice(b"{\"argv\":[\"/bin/sh\"]}\n");
        assert_eq!(wait_for_start(dir.path(), &input[..]).unwrap(), m);
        assert_eq!(
            status(dir.path()).unwrap(),
            LaunchStatus::Started("uid-1".into())
        );
        // A restarted launcher finds the start taken and refuses, whatever it is sent.
        assert!(matches!(
            wait_for_start(dir.path(), &line(&msg(&["/bin/sh"]))[..]),
            Err(LaunchError::AlreadyStarted)
        ));
        assert_eq!(
            status(dir.path()).unwrap(),
            LaunchStatus::Started("uid-1".into())
        );
    }

    #[test]
    fn a_refused_message_spends_the_start_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            wait_for_start(dir.path(), &b"not json\n"[..]),
            Err(LaunchError::Invalid(_))
        ));
        let LaunchStatus::Refused(why) = status(dir.path()).unwrap() else {
            panic!("{:?}", status(dir.path()));
        };
        assert!(why.contains("invalid"), "{why}");
        assert!(matches!(
            wait_for_start(dir.path(), &line(&msg(&["/bin/true"]))[..]),
            Err(LaunchError::AlreadyStarted)
        ));
    }

    #[test]
    fn a_status_line_reads_back() {
        for s in [
            LaunchStatus::Waiting,
            LaunchStatus::Reading,
            LaunchStatus::Started("0b1c-uid".into()),
            LaunchStatus::Refused("the start message is invalid: x".into()),
        ] {
            assert_eq!(LaunchStatus::parse(&s.line()), s);
        }
    }
}
