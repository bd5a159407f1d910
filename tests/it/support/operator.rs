//! The operator binary under test, started as a process against the test bed's control plane.
//!
//! `Operator::builder(namespace, store_url)` starts `sandboxrun-operator run` with the flags every
//! test needs (its namespace, its store, no webhook, a loopback metrics port, debug logs); a test
//! adds or replaces flags with `.flags(..)`, and talks as someone else with `.kubeconfig(..)`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{kubeconfig_path, rand_u32};

/// The operator binary under test, running against the local control plane; killed when dropped.
pub struct Operator {
    child: Child,
    pub log: PathBuf,
}

/// How to start an [`Operator`]: see [`Operator::builder`].
pub struct OperatorBuilder {
    namespace: String,
    store_url: String,
    flags: Vec<String>,
    kubeconfig: PathBuf,
}

impl Operator {
    /// An operator watching `namespace` and storing into `store_url`. A flag given with
    /// [`OperatorBuilder::flags`] replaces the default of the same flag instead of being appended
    /// after it: clap refuses a single-value flag given twice (e.g. `--webhook-addr '' …
    /// --webhook-addr 127.0.0.1:9443` exits 2).
    pub fn builder(namespace: &str, store_url: &str) -> OperatorBuilder {
        OperatorBuilder {
            namespace: namespace.to_string(),
            store_url: store_url.to_string(),
            flags: Vec::new(),
            kubeconfig: kubeconfig_path(),
        }
    }

    /// The operator's log so far (for assertion messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The operator's log so far without its terminal colours (tracing's text format colours
    /// the level and the field names), for tests that look for a line or read its fields.
    pub fn plain_log_text(&self) -> String {
        let text = self.log_text();
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Sends SIGKILL (a crash, for restart tests).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The operator process id (e.g. to read its /proc entries).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the operator process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process ended; None while it runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

impl OperatorBuilder {
    /// More flags after `run`: `--name value` pairs, or bare `--switch`es. A flag named here
    /// replaces its default.
    pub fn flags<S: AsRef<str>>(mut self, flags: &[S]) -> Self {
        self.flags
            .extend(flags.iter().map(|s| s.as_ref().to_string()));
        self
    }

    /// `options` as `--store-option key=value` flags (the store's endpoint, credentials, …).
    pub fn store_options(self, options: &[(String, String)]) -> Self {
        let flags = super::store::store_flags(options);
        self.flags(&flags)
    }

    /// Talks to the apiserver through `kubeconfig` (e.g. a ServiceAccount's token) instead of the
    /// test bed's admin credentials.
    pub fn kubeconfig(mut self, kubeconfig: &Path) -> Self {
        self.kubeconfig = kubeconfig.to_path_buf();
        self
    }

    /// The full argument list: `run`, every default not overridden, then the test's flags.
    pub fn args(&self) -> Vec<String> {
        let pod_name = format!("operator-{}", self.namespace);
        // The kwok node's exec runs on this host: the holder's binary is this build's.
        // No webhook by default, so no admission stamps: a run that uses its author's rights is
        // run as before (`trust`); the tests of the stamps ask for `hold`.
        let defaults: [(&str, &str); 9] = [
            ("--unadmitted-references", "trust"),
            ("--namespaces", &self.namespace),
            ("--store-url", &self.store_url),
            ("--metrics-addr", "127.0.0.1:0"),
            ("--webhook-addr", ""),
            ("--holder-image", "sandboxrun-operator:test"),
            ("--holder-binary", env!("CARGO_BIN_EXE_sandboxrun-operator")),
            ("--log-level", "info,sandboxrun_operator=debug"),
            ("--pod-name", &pod_name),
        ];
        let mut args = vec!["run".to_string()];
        for (flag, value) in defaults {
            if !self.flags.iter().any(|f| f == flag) {
                args.push(flag.to_string());
                args.push(value.to_string());
            }
        }
        // A pool seals its pods with the admission key, kept in a Secret of --pod-namespace
        // (docs/contract.md "A warm pool's launcher is the operator's code"): the test's own
        // namespace, where the operator may create it, unless the test names another.
        let warm = self.flags.iter().any(|f| f == "--warm-pools");
        if warm && !self.flags.iter().any(|f| f == "--pod-namespace") {
            args.push("--pod-namespace".to_string());
            args.push(self.namespace.clone());
        }
        args.extend(self.flags.iter().cloned());
        args
    }

    /// Starts the binary; its stdout and stderr go to [`Operator::log`].
    pub fn start(self) -> Operator {
        let log = std::env::temp_dir().join(format!(
            "sandboxrun-operator-{}-{}.log",
            self.namespace,
            rand_u32()
        ));
        let file = std::fs::File::create(&log).expect("operator log file");
        let err = file.try_clone().expect("clone log file");
        let child = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
            .args(self.args())
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start the operator binary");
        Operator { child, log }
    }
}
