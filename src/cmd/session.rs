//! `exec`, `shell` and `cp` (`crate::plugin::session`): a live sandbox reached with the caller's
//! own kubeconfig. `exec` and `shell` exit with the command's own exit code (1 when the sandbox
//! cannot be reached, with the reason on stderr); `cp` exits 0 once the file is copied.

use std::process::ExitCode;

use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use kube::{Api, Client};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::api::SandboxRun;
use crate::plugin::cluster::{connect, ClusterArgs};
use crate::plugin::session::{
    copy_of, inside_read_back, live_pod, read_argv, write_argv, CheckpointArgs, Copy, CpArgs,
    ExecArgs, ShellArgs,
};
use crate::pod::WORKLOAD_CONTAINER as WORKLOAD;

/// Why a live sandbox could not be reached, or the command in it not run to its end.
#[derive(Debug, thiserror::Error)]
enum ExecError {
    /// The run's declared paths or its pod refuse (`plugin::session`'s words).
    #[error(transparent)]
    Session(#[from] crate::plugin::session::SessionError),
    /// No cluster.
    #[error(transparent)]
    Cluster(#[from] crate::plugin::cluster::ClusterError),
    /// A local file could not be created, opened or read.
    #[error("{what} {local}: {source}")]
    Local {
        /// `create`, `open` or `stat`.
        what: &'static str,
        /// The local file.
        local: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The copy's command in the sandbox failed.
    #[error("{what} {path} in the sandbox exited {code}")]
    Exited {
        /// `reading` or `writing`.
        what: &'static str,
        /// The sandbox's path.
        path: String,
        /// Its exit code.
        code: i32,
    },
    /// No such run.
    #[error("no SandboxRun {namespace}/{name}")]
    NoRun {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The run could not be read.
    #[error("cannot read SandboxRun {namespace}/{name}: {source}")]
    ReadRun {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The exec could not start.
    #[error("exec in {namespace}/{pod} ({container}): {source}")]
    Exec {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The container.
        container: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The command's output could not be read.
    #[error("reading the command's output: {0}")]
    Output(#[source] std::io::Error),
    /// The local output could not be written.
    #[error("writing: {0}")]
    Write(#[source] std::io::Error),
    /// The exec ended without an exit code (its status, as `Debug` prints it).
    #[error("the exec reported no exit code: {0}")]
    NoExitCode(String),
}

/// The stdin of an exec.
enum Input {
    /// Closed at its end, so the command sees end of file (`exec -i`, `shell`).
    Stream(Box<dyn AsyncRead + Unpin + Send>),
    /// Kept open until the command exits: the command reads a count it was given (`cp` in; see
    /// [`crate::plugin::session::write_argv`]).
    Counted(tokio::fs::File),
}

/// What one exec needs: where, what, and which local streams it is wired to.
struct Exec<'a> {
    client: &'a Client,
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
    argv: Vec<String>,
}

/// Runs `exec`.
pub(crate) async fn exec(args: ExecArgs) -> ExitCode {
    let input = args.stdin.then(stdin);
    let command = args.command.clone();
    session(&args.cluster, &args.run, &args.container, command, input).await
}

/// This process's stdin, closed at its end.
fn stdin() -> Input {
    Input::Stream(Box::new(tokio::io::stdin()))
}

/// Runs `shell`: the workload's shell, reading this process's stdin.
pub(crate) async fn shell(args: ShellArgs) -> ExitCode {
    let argv = vec![args.shell.clone(), "-i".to_string()];
    session(&args.cluster, &args.run, WORKLOAD, argv, Some(stdin())).await
}

/// One exec in the run's live pod, this process's stdout and stderr wired to it.
async fn session(
    cluster: &ClusterArgs,
    run: &str,
    container: &str,
    argv: Vec<String>,
    input: Option<Input>,
) -> ExitCode {
    let reached = match reach(cluster, run).await {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
    let (client, namespace, _, pod) = &reached;
    let exec = Exec {
        client,
        namespace,
        pod,
        container,
        argv,
    };
    match run_exec(&exec, input, tokio::io::stdout()).await {
        Ok(code) => exit_with(code),
        Err(e) => fail(&e.to_string()),
    }
}

/// Runs `cp`.
pub(crate) async fn cp(args: CpArgs) -> ExitCode {
    let copy = match copy_of(&args.source, &args.destination) {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    let name = match &copy {
        Copy::Out { run, .. } | Copy::In { run, .. } => run.clone(),
    };
    let (client, namespace, run, pod) = match reach(&args.cluster, &name).await {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
    let copied = match &copy {
        Copy::Out { path, local, .. } => {
            copy_out(&client, &namespace, &run, &pod, path, local).await
        }
        Copy::In { local, path, .. } => copy_in(&client, &namespace, &run, &pod, local, path).await,
    };
    match copied {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// `path` of the sandbox into the local file `local` (created or truncated).
async fn copy_out(
    client: &Client,
    namespace: &str,
    run: &SandboxRun,
    pod: &str,
    path: &str,
    local: &str,
) -> Result<(), ExecError> {
    let path = inside_read_back(run, path)?;
    let file = tokio::fs::File::create(local)
        .await
        .map_err(|source| local_error("create", local, source))?;
    let exec = Exec {
        client,
        namespace,
        pod,
        container: WORKLOAD,
        argv: read_argv(path),
    };
    match run_exec(&exec, None, file).await? {
        0 => Ok(()),
        code => Err(ExecError::Exited {
            what: "reading",
            path: path.to_string(),
            code,
        }),
    }
}

/// The local file `local` into `path` of the sandbox.
async fn copy_in(
    client: &Client,
    namespace: &str,
    run: &SandboxRun,
    pod: &str,
    local: &str,
    path: &str,
) -> Result<(), ExecError> {
    let path = inside_read_back(run, path)?;
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|source| local_error("open", local, source))?;
    let bytes = file
        .metadata()
        .await
        .map_err(|source| local_error("stat", local, source))?
        .len();
    let exec = Exec {
        client,
        namespace,
        pod,
        container: WORKLOAD,
        argv: write_argv(path, bytes),
    };
    let input = Input::Counted(file);
    match run_exec(&exec, Some(input), tokio::io::stdout()).await? {
        0 => Ok(()),
        code => Err(ExecError::Exited {
            what: "writing",
            path: path.to_string(),
            code,
        }),
    }
}

/// A local file's error.
fn local_error(what: &'static str, local: &str, source: std::io::Error) -> ExecError {
    ExecError::Local {
        what,
        local: local.to_string(),
        source,
    }
}

/// The client, the namespace, the run and its live pod, or why not.
async fn reach(
    cluster: &ClusterArgs,
    name: &str,
) -> Result<(Client, String, SandboxRun, String), ExecError> {
    let (client, namespace) = connect(cluster).await?;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &namespace);
    let run = match runs.get_opt(name).await {
        Ok(Some(run)) => run,
        Ok(None) => {
            return Err(ExecError::NoRun {
                namespace,
                name: name.to_string(),
            })
        }
        Err(source) => {
            return Err(ExecError::ReadRun {
                namespace,
                name: name.to_string(),
                source,
            })
        }
    };
    let pod = live_pod(&run)?;
    Ok((client, namespace, run, pod))
}

/// The pipes between this process and the exec's stdin and stdout.
const PIPE_BUFFER: usize = 256 * 1024;

/// Runs `exec` with `input` as its stdin (none: closed) and its stdout into `output`, its stderr
/// into this process's; the command's exit code.
async fn run_exec(
    exec: &Exec<'_>,
    input: Option<Input>,
    mut output: impl AsyncWrite + Unpin,
) -> Result<i32, ExecError> {
    let pods: Api<Pod> = Api::namespaced(exec.client.clone(), exec.namespace);
    let mut params = AttachParams::default()
        .container(exec.container)
        .stdin(input.is_some())
        .stdout(true)
        .stderr(true);
    // kube's default pipes hold 1 KiB, one websocket message each: `cp` into and out of a
    // sandbox moved 1 KiB a message (docs/performance.md "Pause and resume").
    params.max_stdin_buf_size = Some(PIPE_BUFFER);
    params.max_stdout_buf_size = Some(PIPE_BUFFER);
    let mut attached = pods
        .exec(exec.pod, exec.argv.clone(), &params)
        .await
        .map_err(|source| ExecError::Exec {
            namespace: exec.namespace.to_string(),
            pod: exec.pod.to_string(),
            container: exec.container.to_string(),
            source,
        })?;
    let status = attached.take_status();
    // A counted stdin's writer comes back from its task and is dropped only after the exit.
    let feeding = match (input, attached.stdin()) {
        (Some(Input::Stream(mut input)), Some(mut writer)) => {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut input, &mut writer).await;
                let _ = writer.shutdown().await;
            });
            None
        }
        (Some(Input::Counted(mut input)), Some(mut writer)) => Some(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut input, &mut writer).await;
            writer
        })),
        _ => None,
    };
    let errors = attached.stderr().map(|mut reader| {
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut reader, &mut tokio::io::stderr()).await;
        })
    });
    if let Some(mut reader) = attached.stdout() {
        tokio::io::copy(&mut reader, &mut output)
            .await
            .map_err(ExecError::Output)?;
    }
    output.flush().await.map_err(ExecError::Write)?;
    if let Some(errors) = errors {
        let _ = errors.await;
    }
    let status = match status {
        Some(status) => status.await,
        None => None,
    };
    let open_until_now = match feeding {
        Some(task) => task.await.ok(),
        None => None,
    };
    drop(open_until_now);
    let _ = attached.join().await;
    status
        .as_ref()
        .and_then(crate::drain::exec::exit_code)
        .ok_or_else(|| ExecError::NoExitCode(format!("{status:?}")))
}

/// The process's exit code for the command's `code` (0-255; anything else is 1).
fn exit_with(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Says why on stderr; exit 1.
/// Runs `checkpoint`: sets `spec.checkpoint` (a merge patch with the caller's rights), then waits
/// until the run records it; 0 when every path was kept, 1 when refused, a path failed or the
/// wait ran out.
pub(crate) async fn checkpoint(args: CheckpointArgs) -> ExitCode {
    let limit = match crate::units::parse_duration(&args.timeout) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sandboxrun: --timeout: {e}");
            return ExitCode::from(2);
        }
    };
    let (client, namespace) = match connect(&args.cluster).await {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    let token = args
        .token
        .clone()
        .unwrap_or_else(|| format!("kubectl-{}", jiff::Timestamp::now().as_second()));
    let runs: Api<SandboxRun> = Api::namespaced(client, &namespace);
    let patch = serde_json::json!({"spec": {"checkpoint": token}});
    let params = kube::api::PatchParams::default();
    if let Err(e) = runs
        .patch(&args.run, &params, &kube::api::Patch::Merge(&patch))
        .await
    {
        return fail(&format!(
            "cannot ask {namespace}/{} for a checkpoint: {e}",
            args.run
        ));
    }
    eprintln!(
        "sandboxrun: asked {namespace}/{} for checkpoint {token:?}",
        args.run
    );
    if limit.is_zero() {
        return ExitCode::SUCCESS;
    }
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let run = match runs.get(&args.run).await {
            Ok(run) => run,
            Err(e) => return fail(&format!("cannot read {namespace}/{}: {e}", args.run)),
        };
        let recorded = run
            .status
            .as_ref()
            .and_then(|s| s.checkpoints.iter().find(|c| c.token == token).cloned());
        if let Some(cp) = recorded {
            let (report, kept) = crate::plugin::session::checkpoint_report(&cp);
            println!("{}", report.replace("{run}", &args.run));
            return if kept {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
        }
        if tokio::time::Instant::now() >= deadline {
            return fail(&format!(
                "checkpoint {token:?} of {namespace}/{} was not recorded in {}",
                args.run, args.timeout
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("sandboxrun: {message}");
    ExitCode::from(1)
}
