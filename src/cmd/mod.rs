//! The command line, one file per subcommand: `run` ([`run`] the flags, [`operate`] the wiring),
//! `crd`, `doctor`, `holder`, `egress-gate`, `pack`, `files`, `logs`, `selftest`, `egress-proxy`, `completion`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) mod crd;
pub(crate) mod doctor;
pub(crate) mod egress_proxy;
pub(crate) mod files;
pub(crate) mod gate;
pub(crate) mod holder;
pub(crate) mod launch;
pub(crate) mod logs;
pub(crate) mod operate;
pub(crate) mod pack;
pub(crate) mod run;
pub(crate) mod selftest;
pub(crate) mod session;

/// sandboxrun-operator: runs SandboxRuns and drains their read-back paths into object storage.
#[derive(Parser, Debug)]
#[command(name = "sandboxrun-operator", version, about)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run the controller, the admission webhook and the metrics endpoint.
    Run(Box<run::RunArgs>),
    /// Print the SandboxRun CustomResourceDefinition (YAML); `--template`: the
    /// SandboxRunTemplate one; `--cluster-template`: the ClusterSandboxRunTemplate one;
    /// `--pool`: the SandboxRunPool one.
    Crd(crd::CrdArgs),
    /// Check SandboxRun manifests offline with the admission rules (ADR-006).
    Doctor(crate::doctor::DoctorArgs),
    /// The holder container: idle, or the preStop wait, or mark the pod drained.
    Holder(holder::HolderArgs),
    /// Write a tar of a directory to stdout (exec'd in the holder by the drain).
    Pack(pack::PackArgs),
    /// The egress gate: a filtered run's init container, which holds the workload until the
    /// run's NetworkPolicy is in force.
    EgressGate(gate::GateArgs),
    /// A warm pool pod's launcher: reads one start message from stdin, then execs the run's
    /// command.
    Launch(launch::LaunchArgs),
    /// Prints what this container's launcher did with the pod's one start.
    LaunchStatus(launch::LaunchArgs),
    /// A warm pool pod's init container: copies this binary to the launcher's volume.
    LaunchInstall(launch::InstallArgs),
    /// Put a saved generation back into a read-back path (exec'd in the holder by the restore):
    /// a tar on stdin, regular files and directories only.
    RestoreUnpack(launch::UnpackArgs),
    /// List or fetch a run's drained files from the object store (found from the run's status,
    /// or --store-url).
    Files(crate::files::FilesArgs),
    /// How a run ended, from its status: exit code, termination message, each path's drain.
    Logs(crate::plugin::logs::LogsArgs),
    /// Run a command in a live sandbox (its workload container) with your own rights; exits
    /// with the command's exit code.
    Exec(crate::plugin::session::ExecArgs),
    /// An interactive shell in a live sandbox's workload (reads stdin; no terminal).
    Shell(crate::plugin::session::ShellArgs),
    /// Copy a file into or out of a live sandbox's read-back paths (RUN:PATH).
    Cp(crate::plugin::session::CpArgs),
    /// Save a running sandbox's read-back paths now, without stopping it (sets spec.checkpoint
    /// with your own rights), and wait until the checkpoint is recorded.
    Checkpoint(crate::plugin::session::CheckpointArgs),
    /// Apply a tiny SandboxRun, wait until it drained, delete it (the chart's `helm test`).
    Selftest(crate::selftest::SelftestArgs),
    /// The egress proxy: enforces SandboxRuns' host rules for their pods.
    EgressProxy(crate::egress::proxy::ProxyArgs),
    /// Print a shell completion script (`source <(sandboxrun-operator completion bash)`).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// The name the binary answers to: `kubectl sandboxrun` when it was installed (or symlinked) as
/// the kubectl plugin `kubectl-sandboxrun`, else `sandboxrun-operator`.
pub(crate) fn bin_name(argv0: &str) -> &'static str {
    let file = std::path::Path::new(argv0)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    if file.starts_with("kubectl-sandboxrun") {
        "kubectl sandboxrun"
    } else {
        "sandboxrun-operator"
    }
}

/// The command line, parsed under the name the binary was called by ([`bin_name`]), so usage and
/// errors read `kubectl sandboxrun files ls …` when kubectl runs it as a plugin.
fn parse_args() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let argv0 = std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let matches = Cli::command()
        .bin_name(bin_name(&argv0))
        .try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    crate::process::install_crypto_provider();
    let cli = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // ADR-006 §4: a usage error is exit 2 (clap's own code for --help/--version is 0).
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if !matches!(cli.command, Command::Launch(_)) {
        crate::process::keep_small_pages();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(dispatch(cli.command))
}

async fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Crd(args) => crd::main(&args),
        Command::Doctor(args) => doctor::main(args).await,
        Command::Pack(args) => pack::main(args),
        Command::Holder(args) => holder::main(args).await,
        Command::EgressGate(args) => gate::main(args).await,
        Command::Launch(args) => launch::main(args),
        Command::LaunchStatus(args) => launch::status(args),
        Command::LaunchInstall(args) => launch::install(args),
        Command::RestoreUnpack(args) => launch::unpack(args),
        Command::Files(args) => files::main(args).await,
        Command::Logs(args) => logs::main(args).await,
        Command::Exec(args) => session::exec(args).await,
        Command::Shell(args) => session::shell(args).await,
        Command::Cp(args) => session::cp(args).await,
        Command::Checkpoint(args) => session::checkpoint(args).await,
        Command::Selftest(args) => selftest::main(args).await,
        Command::EgressProxy(args) => egress_proxy::main(args).await,
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let argv0 = std::env::args().next().unwrap_or_default();
            let name = bin_name(&argv0).replace(' ', "-");
            clap_complete::generate(shell, &mut Cli::command(), name, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Run(args) => operate::main(*args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::wire::Wire;

    #[test]
    fn cli_parses_every_subcommand() {
        Cli::try_parse_from(["x", "crd"]).unwrap();
        Cli::try_parse_from(["x", "pack", "/tmp"]).unwrap();
        // The operator appends `--budget N` and `--wire zstd` after the path (drain::exec::pack_argv).
        match Cli::try_parse_from(["x", "pack", "/tmp", "--budget", "1048576"])
            .unwrap()
            .command
        {
            Command::Pack(p) => assert_eq!((p.budget, p.wire), (Some(1 << 20), Wire::Tar)),
            other => panic!("parsed as {other:?}"),
        }
        match Cli::try_parse_from(["x", "pack", "/tmp", "--budget", "1", "--wire", "zstd"])
            .unwrap()
            .command
        {
            Command::Pack(p) => assert_eq!(p.wire, Wire::Zstd),
            other => panic!("parsed as {other:?}"),
        }
        assert!(Cli::try_parse_from(["x", "pack", "/tmp", "--budget", "1Mi"]).is_err());
        Cli::try_parse_from(["x", "holder", "--wait-drained", "5m"]).unwrap();
        assert!(
            Cli::try_parse_from(["x", "holder", "--wait-drained", "5m", "--mark-drained"]).is_err()
        );
        Cli::try_parse_from(["x", "run", "--namespaces", "a,b"]).unwrap();
        // doctor takes manifests as arguments or kubectl-style -f, and needs at least one.
        match Cli::try_parse_from([
            "x", "doctor", "--strict", "-f", "a.yaml", "-f", "dir/", "c.yaml",
        ])
        .unwrap()
        .command
        {
            Command::Doctor(d) => {
                assert_eq!(d.files, ["c.yaml"]);
                assert_eq!(d.filename, ["a.yaml", "dir/"]);
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(Cli::try_parse_from(["x", "doctor", "--strict"]).is_err());
        // The plugin's run commands take kubectl's -n/--context/--kubeconfig, after the run too.
        match Cli::try_parse_from(["x", "logs", "job", "-n", "jobs", "--context", "prod"])
            .unwrap()
            .command
        {
            Command::Logs(l) => {
                assert_eq!(l.run, "job");
                assert_eq!(l.cluster.namespace.as_deref(), Some("jobs"));
                assert_eq!(l.cluster.context.as_deref(), Some("prod"));
            }
            other => panic!("parsed as {other:?}"),
        }
        // exec's command follows `--`, with its own flags left to it.
        match Cli::try_parse_from(["x", "exec", "agent", "-n", "ns", "--", "ls", "-la", "/work"])
            .unwrap()
            .command
        {
            Command::Exec(e) => {
                assert_eq!(
                    (e.run.as_str(), e.container.as_str()),
                    ("agent", "workload")
                );
                assert_eq!(e.command, ["ls", "-la", "/work"]);
                assert_eq!(e.cluster.namespace.as_deref(), Some("ns"));
                assert!(!e.stdin);
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["x", "exec", "agent"]).is_err(),
            "a command is required"
        );
        match Cli::try_parse_from(["x", "files", "get", "job", "-o", "d", "--kubeconfig", "k"])
            .unwrap()
            .command
        {
            Command::Files(f) => {
                assert_eq!(
                    f.cluster.namespace, None,
                    "the context's namespace by default"
                );
                assert_eq!(f.cluster.kubeconfig, Some("k".into()));
            }
            other => panic!("parsed as {other:?}"),
        }
        // The kubectl plugin name and shell completion.
        assert_eq!(
            bin_name("/usr/local/bin/kubectl-sandboxrun"),
            "kubectl sandboxrun"
        );
        assert_eq!(bin_name("sandboxrun-operator"), "sandboxrun-operator");
        for shell in ["bash", "zsh", "fish"] {
            assert!(matches!(
                Cli::try_parse_from(["x", "completion", shell]).map(|c| c.command),
                Ok(Command::Completion { .. })
            ));
        }
        let mut script = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut <Cli as clap::CommandFactory>::command(),
            "kubectl-sandboxrun",
            &mut script,
        );
        let script = String::from_utf8_lossy(&script);
        assert!(
            script.contains("kubectl-sandboxrun") && script.contains("files"),
            "{script}"
        );
    }

    /// The chart renders `--allowed-toleration-keys=` for `runPolicy.tolerationKeys: []`: an empty
    /// value is an empty list (nothing allowed), an absent flag no restriction.
    #[test]
    fn the_run_policy_flags_parse_into_lists_and_an_empty_one_allows_nothing() {
        let parsed = Cli::try_parse_from([
            "x",
            "run",
            "--store-url",
            "file:///tmp/s",
            "--allowed-runtime-classes=gvisor,kata",
            "--allowed-toleration-keys=",
        ])
        .unwrap();
        let Command::Run(args) = parsed.command else {
            panic!("not run");
        };
        let policy = args.run_policy();
        assert_eq!(
            policy.runtime_classes,
            Some(vec!["gvisor".to_string(), "kata".to_string()])
        );
        assert_eq!(policy.priority_classes, None);
        assert_eq!(policy.toleration_keys, Some(Vec::new()));
    }

    #[test]
    fn the_default_runtime_class_must_be_a_name_among_the_allowed_ones() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "run", "--store-url", "file:///tmp/s"];
            argv.extend_from_slice(extra);
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not run");
            };
            super::run::default_runtime_class(&args)
        };
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(
            parse(&["--default-runtime-class", "gvisor"]),
            Ok(Some("gvisor".to_string()))
        );
        assert_eq!(
            parse(&[
                "--default-runtime-class",
                "gvisor",
                "--allowed-runtime-classes",
                "gvisor,kata"
            ]),
            Ok(Some("gvisor".to_string()))
        );
        let outside = parse(&[
            "--default-runtime-class",
            "runc",
            "--allowed-runtime-classes",
            "gvisor",
        ]);
        assert!(outside.unwrap_err().to_string().contains("not among"));
        assert!(parse(&["--default-runtime-class", "Not_A_Name"]).is_err());
    }

    #[test]
    fn run_and_files_take_the_same_store_flags() {
        let want = crate::store::StoreArgs {
            store_url: "s3://bucket/p".into(),
            store_options: crate::store::StoreOptions {
                options: vec!["region=x".into(), "allow_http=true".into()],
            },
        };
        let flags = [
            "--store-url",
            "s3://bucket/p",
            "--store-option",
            "region=x,allow_http=true",
        ];
        let run = ["x", "run"].iter().chain(&flags).copied();
        match Cli::try_parse_from(run).unwrap().command {
            Command::Run(args) => assert_eq!(args.store, want),
            other => panic!("parsed as {other:?}"),
        }
        // After the `files` subcommand's own subcommand too (global flags).
        let files = ["x", "files", "ls", "job"].iter().chain(&flags).copied();
        match Cli::try_parse_from(files).unwrap().command {
            Command::Files(args) => {
                assert_eq!(
                    args.store.store_url.as_deref(),
                    Some(want.store_url.as_str())
                );
                assert_eq!(args.store.store_options, want.store_options);
            }
            other => panic!("parsed as {other:?}"),
        }
    }
}
