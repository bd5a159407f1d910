//! The command line: `run | crd | doctor | holder | pack | files`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing::{error, info};

use crate::config::{CapSettings, MIB};

/// sandboxrun-operator: runs SandboxRuns and drains their read-back paths into object storage.
#[derive(Parser, Debug)]
#[command(name = "sandboxrun-operator", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller, the admission webhook and the metrics endpoint.
    Run(Box<RunArgs>),
    /// Print the SandboxRun CustomResourceDefinition (YAML).
    Crd,
    /// Check SandboxRun manifests offline with the admission rules (ADR-006).
    Doctor(crate::admission::doctor::DoctorArgs),
    /// The holder container: idle, or the preStop wait, or mark the pod drained.
    Holder(HolderArgs),
    /// Write a tar of a directory to stdout (exec'd in the holder by the drain).
    Pack(PackArgs),
    /// List or fetch a run's drained files from the object store.
    Files(crate::files::FilesArgs),
    /// Print a shell completion script (`source <(sandboxrun-operator completion bash)`).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// The name the binary answers to: `kubectl sandboxrun` when it was installed (or symlinked) as
/// the kubectl plugin `kubectl-sandboxrun`, else `sandboxrun-operator`.
pub fn bin_name(argv0: &str) -> &'static str {
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

/// Log output format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of `run`. Every flag has an environment variable.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Namespaces to watch (comma-separated); empty watches every namespace.
    #[arg(long, env = "SANDBOXRUN_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Object store URL: file:///dir (embedded default), s3://bucket/prefix, gs://…, az://….
    #[arg(
        long,
        env = "SANDBOXRUN_STORE_URL",
        default_value = "file:///var/lib/sandboxrun/store"
    )]
    pub store_url: String,
    /// Store options as key=value (repeatable / comma-separated), e.g. endpoint=http://…,allow_http=true.
    #[arg(
        long = "store-option",
        env = "SANDBOXRUN_STORE_OPTIONS",
        value_delimiter = ','
    )]
    pub store_options: Vec<String>,
    /// Cap of a read-back path that declares no sizeLimit (bytes or a quantity like 1Gi).
    #[arg(long, env = "SANDBOXRUN_READBACK_DEFAULT_CAP", default_value = "1Gi")]
    pub default_cap: String,
    /// Highest cap any read-back path may get (ADR-143's escape hatch ITERION_SANDBOX_READBACK_CAP).
    #[arg(
        long = "max-cap",
        env = "SANDBOXRUN_READBACK_CAP",
        default_value = "16Gi"
    )]
    pub max_cap: String,
    /// What deleting a run does to its stored archives and manifests when its spec sets no
    /// readBack.retention: `Retain` (keep them) or `Delete` (delete them, after the drain).
    #[arg(long, env = "SANDBOXRUN_DEFAULT_RETENTION", default_value = "Retain")]
    pub default_retention: crate::api::Retention,
    /// Drain timeout of a run that sets no readBack.drainTimeout.
    #[arg(long, env = "SANDBOXRUN_DRAIN_TIMEOUT", default_value = "5m")]
    pub drain_timeout: String,
    /// Longest drain timeout any run gets: admission refuses a readBack.drainTimeout above it, and
    /// a run admitted before it was lowered is drained within it (default: rules'
    /// DEFAULT_MAX_DRAIN_TIMEOUT, which `doctor` judges with).
    #[arg(long, env = "SANDBOXRUN_MAX_DRAIN_TIMEOUT", default_value = "1h")]
    pub max_drain_timeout: String,
    /// How long a pod's image pull may keep failing with a retryable error (ErrImagePull /
    /// ImagePullBackOff) before the run is failed with reason ImagePullFailed, counted from the
    /// pod's start (status.startTime, else its creation). A registry that answers "not found"
    /// fails the run at once.
    #[arg(long, env = "SANDBOXRUN_IMAGE_PULL_TIMEOUT", default_value = "5m")]
    pub image_pull_timeout: String,
    /// Image of the holder container (the operator's own image).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_IMAGE",
        default_value = "ghcr.io/iterion/sandboxrun-operator:latest"
    )]
    pub holder_image: String,
    /// CPU request of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_CPU_REQUEST",
        default_value = crate::pod::DEFAULT_HOLDER_CPU_REQUEST
    )]
    pub holder_cpu_request: String,
    /// Memory request of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_MEMORY_REQUEST",
        default_value = crate::pod::DEFAULT_HOLDER_MEMORY_REQUEST
    )]
    pub holder_memory_request: String,
    /// CPU limit of the holder container (a Kubernetes quantity); none unless set, e.g. for a
    /// namespace whose ResourceQuota requires limits.cpu.
    #[arg(long, env = "SANDBOXRUN_HOLDER_CPU_LIMIT")]
    pub holder_cpu_limit: Option<String>,
    /// Memory limit of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_MEMORY_LIMIT",
        default_value = crate::pod::DEFAULT_HOLDER_MEMORY_LIMIT
    )]
    pub holder_memory_limit: String,
    /// Secrets (type dockerconfigjson) added to every run pod's imagePullSecrets after the run's
    /// own (repeatable / comma-separated), so a holder image from a private registry is pulled.
    /// Each must exist in the runs' namespaces.
    #[arg(
        long = "pod-image-pull-secret",
        env = "SANDBOXRUN_POD_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    pub pod_image_pull_secrets: Vec<String>,
    /// The packer command exec'd in the holder; the path is appended.
    #[arg(
        long,
        env = "SANDBOXRUN_PACK_COMMAND",
        default_value = "sandboxrun-operator pack"
    )]
    pub pack_command: String,
    /// Reconciles running at once.
    #[arg(long, env = "SANDBOXRUN_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Drains (teardowns) running at once, off the reconcile workers: a slow or stuck drain never
    /// holds up the reconciles of other runs; teardowns beyond this wait for a slot.
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_CONCURRENT_DRAINS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub max_concurrent_drains: u16,
    /// Metrics and health address (/metrics, /healthz, /readyz).
    #[arg(long, env = "SANDBOXRUN_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Webhook address (HTTPS); empty disables the webhook server.
    #[arg(long, env = "SANDBOXRUN_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: String,
    /// Webhook certificates: `self-managed` (CA + serving cert kept in a Secret, caBundle patched),
    /// or `files` (cert-manager or any mounted tls.crt/tls.key in --webhook-cert-dir).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CERT_MODE",
        default_value = "self-managed"
    )]
    pub webhook_cert_mode: String,
    /// Directory with tls.crt and tls.key (cert mode `files`).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    pub webhook_cert_dir: PathBuf,
    /// Secret (in --pod-namespace) holding the self-managed CA and serving cert.
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_SECRET",
        default_value = "sandboxrun-operator-webhook-tls"
    )]
    pub webhook_secret: String,
    /// ValidatingWebhookConfiguration whose caBundle the self-managed mode patches.
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CONFIG",
        default_value = "sandboxrun-operator"
    )]
    pub webhook_config: String,
    /// DNS names / IPs of the serving certificate (comma-separated).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_HOSTS",
        value_delimiter = ',',
        default_value = "sandboxrun-operator-webhook.sandboxrun-system.svc"
    )]
    pub webhook_hosts: Vec<String>,
    /// Check image resolvability (no pull) in the webhook; a failure only warns when transient.
    #[arg(long, env = "SANDBOXRUN_CHECK_IMAGES", default_value_t = false)]
    pub check_images: bool,
    /// Elect a leader on a Lease so several replicas can run.
    #[arg(long, env = "SANDBOXRUN_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,
    /// Lease name.
    #[arg(
        long,
        env = "SANDBOXRUN_LEASE_NAME",
        default_value = "sandboxrun-operator"
    )]
    pub lease_name: String,
    /// Namespace of the operator itself (lease, webhook Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "sandboxrun-system")]
    pub pod_namespace: String,
    /// This replica's identity (events, lease).
    #[arg(long, env = "POD_NAME", default_value = "sandboxrun-operator-local")]
    pub pod_name: String,
    /// Log format.
    #[arg(
        long,
        env = "SANDBOXRUN_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. info or sandboxrun_operator=debug.
    #[arg(long, env = "SANDBOXRUN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// Arguments of `holder`.
#[derive(Args, Debug)]
pub struct HolderArgs {
    /// The holder's own directory (drain marker).
    #[arg(long, default_value = crate::pod::HOLDER_STATE_DIR)]
    pub state_dir: PathBuf,
    /// preStop mode: wait until the operator marks the pod drained, at most this long (e.g. 5m).
    #[arg(long, value_name = "DURATION", conflicts_with = "mark_drained")]
    pub wait_drained: Option<String>,
    /// Mark the pod drained (exec'd by the operator after the drain).
    #[arg(long)]
    pub mark_drained: bool,
}

/// Arguments of `pack`.
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Directory to archive.
    pub path: PathBuf,
    /// The path's cap in bytes: a file that would take the packed total over it is written as a
    /// zero-length placeholder carrying the PAX record `SANDBOXRUN.dropped=<size>` (its content
    /// never crosses the wire). Without it every file is packed whole.
    #[arg(long, value_name = "BYTES")]
    pub budget: Option<u64>,
}

/// Parses a cap given in bytes or as a Kubernetes quantity.
pub fn parse_cap(text: &str) -> Result<u64, String> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_string());
    crate::admission::rules::quantity_to_bytes(&q).map_err(|e| format!("bad cap {text:?}: {e}"))
}

/// Cap settings from the run flags.
pub fn caps(args: &RunArgs) -> Result<CapSettings, String> {
    let caps = CapSettings {
        default_bytes: parse_cap(&args.default_cap)?,
        max_bytes: parse_cap(&args.max_cap)?,
    };
    if caps.max_bytes < MIB {
        return Err(format!("--max-cap {} is below 1Mi", args.max_cap));
    }
    Ok(caps)
}

/// The holder container's resources from the run flags (checked as Kubernetes quantities, so a
/// bad value stops the operator at startup instead of failing every pod).
pub fn holder_resources(
    args: &RunArgs,
) -> Result<crate::pod::HolderResources, crate::pod::HolderResourcesError> {
    crate::pod::HolderResources::parse(
        &args.holder_cpu_request,
        &args.holder_memory_request,
        args.holder_cpu_limit.as_deref(),
        &args.holder_memory_limit,
    )
}

fn init_tracing(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Installs the process-wide rustls crypto provider once (kube and object_store would otherwise
/// disagree on one and panic at the first TLS connection: CRATES.md pitfall).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    install_crypto_provider();
    let cli = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // ADR-006 §4: a usage error is exit 2 (clap's own code for --help/--version is 0).
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
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
        Command::Crd => match crate::crdgen::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cannot render the CRD: {e}");
                ExitCode::from(1)
            }
        },
        Command::Doctor(args) => {
            let mut out = std::io::stdout();
            let code = crate::admission::doctor::run(
                args,
                crate::admission::RuleSettings::default(),
                &mut out,
            )
            .await;
            ExitCode::from(code)
        }
        Command::Pack(args) => {
            let stdout = std::io::stdout().lock();
            let stderr = std::io::stderr();
            match crate::pack::pack(
                &args.path,
                args.budget,
                std::io::BufWriter::with_capacity(256 * 1024, stdout),
                stderr,
            ) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sandboxrun-operator pack: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Holder(args) => holder(args).await,
        Command::Files(args) => crate::files::run(args).await,
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let argv0 = std::env::args().next().unwrap_or_default();
            let name = bin_name(&argv0).replace(' ', "-");
            clap_complete::generate(shell, &mut Cli::command(), name, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Run(args) => {
            init_tracing(args.log_format, &args.log_level);
            match crate::operator::run(*args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!(error = %e, "operator stopped");
                    ExitCode::from(1)
                }
            }
        }
    }
}

async fn holder(args: HolderArgs) -> ExitCode {
    if args.mark_drained {
        return match crate::holder::mark_drained(&args.state_dir) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannot mark drained in {}: {e}", args.state_dir.display());
                ExitCode::from(1)
            }
        };
    }
    if let Some(text) = args.wait_drained {
        let timeout = match crate::util::parse_duration(&text) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("--wait-drained: {e}");
                return ExitCode::from(2);
            }
        };
        let drained = crate::holder::wait_drained(&args.state_dir, timeout).await;
        if !drained {
            eprintln!("not marked drained within {text}; letting the pod stop");
        }
        return ExitCode::SUCCESS;
    }
    info!("holder idling until SIGTERM");
    match crate::holder::idle().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holder: {e}");
            ExitCode::from(1)
        }
    }
}

/// Resolves after SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    info!("shutdown requested");
}

/// Grace given to in-flight work after a shutdown request.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Shared handle type for the store.
pub type Store = Arc<dyn object_store::ObjectStore>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_accept_quantities_and_options_need_equals() {
        assert_eq!(parse_cap("1Gi"), Ok(1 << 30));
        assert_eq!(parse_cap("1048576"), Ok(1 << 20));
        assert!(parse_cap("lots").is_err());
        assert_eq!(
            crate::util::parse_options(&["endpoint=http://x".into(), "allow_http=true".into()]),
            Ok(vec![
                ("endpoint".into(), "http://x".into()),
                ("allow_http".into(), "true".into())
            ])
        );
        assert!(crate::util::parse_options(&["novalue".into()]).is_err());
    }

    #[tokio::test]
    async fn mark_drained_writes_the_marker_and_exits_zero() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().to_path_buf();
        let cli = Cli::try_parse_from([
            std::ffi::OsStr::new("sandboxrun-operator"),
            std::ffi::OsStr::new("holder"),
            std::ffi::OsStr::new("--state-dir"),
            state_dir.as_os_str(),
            std::ffi::OsStr::new("--mark-drained"),
        ])
        .unwrap();
        let Command::Holder(args) = cli.command else {
            panic!("not the holder");
        };
        assert_eq!(holder(args).await, ExitCode::SUCCESS);
        assert!(state_dir.join(crate::holder::DRAINED_MARKER).is_file());
        // The preStop hook sees it at once.
        assert!(crate::holder::wait_drained(&state_dir, Duration::from_millis(10)).await);

        // A state dir that cannot be written is a failure, not a silent success.
        let missing = HolderArgs {
            state_dir: state_dir.join("missing"),
            wait_drained: None,
            mark_drained: true,
        };
        assert_eq!(holder(missing).await, ExitCode::from(1));
    }

    #[test]
    fn the_image_pull_timeout_defaults_to_five_minutes() {
        let Command::Run(args) = Cli::try_parse_from(["x", "run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(
            crate::util::parse_duration(&args.image_pull_timeout),
            Ok(crate::config::DEFAULT_IMAGE_PULL_TIMEOUT)
        );
        let Command::Run(args) = Cli::try_parse_from(["x", "run", "--image-pull-timeout", "90s"])
            .unwrap()
            .command
        else {
            panic!("not run");
        };
        assert_eq!(
            crate::util::parse_duration(&args.image_pull_timeout),
            Ok(Duration::from_secs(90))
        );
    }

    #[test]
    fn holder_resource_flags_default_to_todays_values_and_are_checked() {
        let run_args = |extra: &[&str]| {
            let argv = ["x", "run"].iter().chain(extra).copied();
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Run(args) => *args,
                other => panic!("parsed as {other:?}"),
            }
        };
        assert_eq!(
            holder_resources(&run_args(&[])),
            Ok(crate::pod::HolderResources::default())
        );
        let set = holder_resources(&run_args(&[
            "--holder-cpu-request=100m",
            "--holder-memory-request=32Mi",
            "--holder-cpu-limit=1",
            "--holder-memory-limit=256Mi",
        ]))
        .unwrap();
        let q = |s: &str| {
            Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                s.into(),
            ))
        };
        assert_eq!(
            (
                set.cpu_request,
                set.memory_request,
                set.cpu_limit,
                set.memory_limit
            ),
            (q("100m"), q("32Mi"), q("1"), q("256Mi"))
        );
        assert!(matches!(
            holder_resources(&run_args(&["--holder-cpu-limit=fast"])),
            Err(crate::pod::HolderResourcesError::NotAQuantity { .. })
        ));
    }

    #[test]
    fn cli_parses_every_subcommand() {
        Cli::try_parse_from(["x", "crd"]).unwrap();
        Cli::try_parse_from(["x", "pack", "/tmp"]).unwrap();
        // The operator appends `--budget N` after the path (see drain::exec::pack_argv).
        match Cli::try_parse_from(["x", "pack", "/tmp", "--budget", "1048576"])
            .unwrap()
            .command
        {
            Command::Pack(p) => assert_eq!(p.budget, Some(1 << 20)),
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
}
