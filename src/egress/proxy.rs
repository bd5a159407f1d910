//! `sandboxrun-operator egress-proxy`: the forward proxy that enforces a run's host rules
//! (docs/contract.md "ADR-006 network rules: validated and enforced").
//!
//! - `CONNECT host:port` is a TLS passthrough (no interception): after the verdict, bytes are
//!   copied both ways as they come ([`crate::egress::tunnel`]);
//! - a plain-HTTP request with an absolute URI is forwarded in origin form with `Connection:
//!   close`, without the proxy's own headers and with the URI's host as its `Host`
//!   ([`crate::egress::head::forward_head`]), then streamed the same way;
//! - `Proxy-Authorization: Basic <run uid>:<token>` finds the run; the token opens nothing once
//!   the run is being torn down or has ended, nor from an address that is not one of the run's
//!   pods ([`crate::egress::runs`]); any of these is a 407;
//! - the verdict is the admission matcher's ([`crate::egress::network::decide`]) on the
//!   run's CURRENT rules (a watch keeps them), and a refusal is a 403 whose body names the rule;
//! - names are resolved fully qualified (no search list), and a name that resolves to an address
//!   an IP/CIDR rule denies is refused too (so `!169.254.169.254` holds against a name pointing
//!   there);
//! - connections are bounded globally, per run, per namespace and, before a run is known, per
//!   source address
//!   ([`crate::egress::limits`]); reading the head, resolving, connecting and an idle tunnel each
//!   have a time bound; every refusal is counted by reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::{Api, Client};
use prometheus::Registry;
use thiserror::Error;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tracing::{debug, info, warn};

use crate::egress::request::handle;
use crate::egress::runs::{canonical, watch_pods, watch_runs};
use crate::egress::state::verdict;

pub use crate::egress::limits::Limits;
pub use crate::egress::runs::{RunRules, RunTable};
pub use crate::egress::state::{ProxyState, Resolve, SystemResolver, Timeouts, REFUSAL_REASONS};

/// Settings of `egress-proxy`. Every flag has an environment variable.
#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Address the proxy listens on (an IP and a port).
    #[arg(long, env = "SANDBOXRUN_EGRESS_LISTEN", default_value = "0.0.0.0:3128")]
    pub listen: String,
    /// Metrics and health address (/metrics, /healthz, /readyz).
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_addr: String,
    /// Namespaces whose runs are served (comma-separated); empty: every namespace.
    #[arg(long, env = "SANDBOXRUN_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// File holding the secret the per-run tokens are derived from (the operator's
    /// --egress-token-secret-file).
    #[arg(long, env = "SANDBOXRUN_EGRESS_TOKEN_SECRET_FILE")]
    pub token_secret_file: std::path::PathBuf,
    /// Bound on reading a request head (from the accept; a 408 after it).
    #[arg(long, env = "SANDBOXRUN_EGRESS_HEAD_TIMEOUT", default_value = "10s")]
    pub head_timeout: String,
    /// Bound on resolving a host name.
    #[arg(long, env = "SANDBOXRUN_EGRESS_RESOLVE_TIMEOUT", default_value = "5s")]
    pub resolve_timeout: String,
    /// Bound on connecting to the destination.
    #[arg(long, env = "SANDBOXRUN_EGRESS_CONNECT_TIMEOUT", default_value = "10s")]
    pub connect_timeout: String,
    /// A tunnel or forwarded request on which no byte moved either way for this long is closed.
    #[arg(long, env = "SANDBOXRUN_EGRESS_IDLE_TIMEOUT", default_value = "5m")]
    pub idle_timeout: String,
    /// Connections open at once, all runs together; more are refused with a 503.
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_MAX_CONNECTIONS",
        default_value_t = 4096
    )]
    pub max_connections: usize,
    /// Connections of one run open at once; more are refused with a 429.
    #[arg(long, env = "SANDBOXRUN_EGRESS_MAX_PER_RUN", default_value_t = 512)]
    pub max_per_run: usize,
    /// Connections of all the runs of one namespace open at once; more are refused with a 429
    /// (a quarter of --max-connections by default: one tenant cannot fill the proxy).
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_MAX_PER_NAMESPACE",
        default_value_t = 1024
    )]
    pub max_per_namespace: usize,
    /// Connections from one source address still sending their request head; more are refused.
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_MAX_PENDING_PER_SOURCE",
        default_value_t = 256
    )]
    pub max_pending_per_source: usize,
    /// Length of the kernel's queue of connections not yet accepted.
    #[arg(long, env = "SANDBOXRUN_EGRESS_ACCEPT_BACKLOG", default_value_t = 1024)]
    pub accept_backlog: u32,
    /// The canary's address (an IP and a port; none by default): a listener that accepts and
    /// closes at once, which no run's NetworkPolicy allows. A filtered run's egress gate probes
    /// it at this proxy's address until refused (`crate::inpod::gate`): the same process answers
    /// both ports, so a refused canary beside an answering proxy is the run's policy in force.
    #[arg(long, env = "SANDBOXRUN_EGRESS_CANARY_LISTEN")]
    pub canary_listen: Option<String>,
    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub log: crate::process::LogArgs,
}

/// Why the proxy stopped.
#[derive(Debug, Error)]
pub enum ProxyError {
    /// A flag is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The cluster cannot be reached.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    /// A listener cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The metric cannot be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The token secret file cannot serve.
    #[error("configuration: {0}")]
    Secret(#[from] SecretError),
}

/// Binds `addr` (an IP and a port) with a kernel accept queue of `backlog` connections.
pub fn bind(addr: &str, backlog: u32) -> std::io::Result<TcpListener> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Accepts connections until `shutdown` resolves; each one with a slot is served by its own
/// task, the others are refused at once.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => admit(stream, peer, &state),
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Gives a connection just accepted its slot and its task, or refuses it without waiting on it.
fn admit(stream: TcpStream, peer: SocketAddr, state: &Arc<ProxyState>) {
    match state.slots.accept(canonical(peer.ip())) {
        Ok(slot) => {
            let state = Arc::clone(state);
            tokio::spawn(async move {
                if let Err(e) = handle(stream, peer, slot, &state).await {
                    debug!(%peer, error = %e, "egress connection ended with an error");
                }
            });
        }
        Err(why) => {
            state.refuse(why.label());
            state.count(verdict::ERROR);
            debug!(%peer, reason = why.label(), "egress connection refused a slot");
            // Best effort, never awaited: a refused peer cannot hold the accept loop.
            let _ = stream.try_write(
                b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            );
        }
    }
}

/// `sandboxrun-operator egress-proxy`.
pub async fn run(args: ProxyArgs) -> Result<(), ProxyError> {
    let secret = read_secret(&args.token_secret_file)?;
    let timeouts = timeouts_of(&args)?;
    let limits = limits_of(&args)?;
    let client = Client::try_default().await?;
    let table = Arc::new(RunTable::default());
    let namespaces: Vec<String> = args
        .namespaces
        .iter()
        .filter(|n| !n.trim().is_empty())
        .cloned()
        .collect();
    if namespaces.is_empty() {
        tokio::spawn(watch_runs(Api::all(client.clone()), Arc::clone(&table)));
        tokio::spawn(watch_pods(Api::all(client.clone()), Arc::clone(&table)));
    } else {
        for ns in &namespaces {
            tokio::spawn(watch_runs(
                Api::namespaced(client.clone(), ns),
                Arc::clone(&table),
            ));
            tokio::spawn(watch_pods(
                Api::namespaced(client.clone(), ns),
                Arc::clone(&table),
            ));
        }
    }
    let state = Arc::new(ProxyState::new(table, secret, timeouts)?.with_limits(limits));
    let registry = Registry::new();
    state.register(&registry)?;
    serve_metrics(&args.metrics_addr, registry, Arc::clone(&state.runs)).await?;
    let listener =
        bind(&args.listen, args.accept_backlog).map_err(|source| ProxyError::Listen {
            addr: args.listen.clone(),
            source,
        })?;
    if let Some(addr) = &args.canary_listen {
        let canary = bind(addr, args.accept_backlog).map_err(|source| ProxyError::Listen {
            addr: addr.clone(),
            source,
        })?;
        info!(%addr, "egress gate canary listening");
        tokio::spawn(serve_canary(canary));
    }
    info!(addr = %args.listen, ?limits, ?timeouts, "egress proxy listening");
    serve(listener, state, crate::process::shutdown_signal()).await;
    Ok(())
}

/// The canary: accepts and closes, reading and writing nothing, so it holds no slot, buffer or
/// task per connection.
pub async fn serve_canary(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => drop(stream),
            Err(e) => {
                warn!(error = %e, "canary accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn timeouts_of(args: &ProxyArgs) -> Result<Timeouts, ProxyError> {
    let dur = |flag: &str, text: &str| {
        crate::units::parse_duration(text).map_err(|e| ProxyError::Config(format!("{flag}: {e}")))
    };
    Ok(Timeouts {
        head: dur("--head-timeout", &args.head_timeout)?,
        resolve: dur("--resolve-timeout", &args.resolve_timeout)?,
        connect: dur("--connect-timeout", &args.connect_timeout)?,
        idle: dur("--idle-timeout", &args.idle_timeout)?,
    })
}

fn limits_of(args: &ProxyArgs) -> Result<Limits, ProxyError> {
    let limits = Limits {
        max_connections: args.max_connections,
        max_per_run: args.max_per_run,
        max_pending_per_source: args.max_pending_per_source,
        max_per_namespace: args.max_per_namespace,
    };
    if limits.max_connections == 0
        || limits.max_per_run == 0
        || limits.max_pending_per_source == 0
        || limits.max_per_namespace == 0
    {
        return Err(ProxyError::Config(
            "--max-connections, --max-per-run, --max-per-namespace and --max-pending-per-source \
             must be at least 1"
                .to_string(),
        ));
    }
    Ok(limits)
}

/// A token secret file that cannot serve.
#[derive(Debug, Error)]
pub enum SecretError {
    /// It cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// It holds fewer than 16 bytes.
    #[error("{path}: the token secret is shorter than 16 bytes")]
    Short {
        /// The file.
        path: String,
    },
}

/// Reads the token secret from a file (trailing newline dropped); refuses an empty one.
pub(crate) fn read_secret(path: &std::path::Path) -> Result<Arc<[u8]>, SecretError> {
    let raw = std::fs::read(path).map_err(|source| SecretError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let trimmed = raw
        .strip_suffix(b"\n")
        .map(|r| r.strip_suffix(b"\r").unwrap_or(r))
        .unwrap_or(&raw);
    if trimmed.len() < 16 {
        return Err(SecretError::Short {
            path: path.display().to_string(),
        });
    }
    Ok(Arc::from(trimmed))
}

async fn serve_metrics(
    addr: &str,
    registry: Registry,
    runs: Arc<RunTable>,
) -> Result<(), ProxyError> {
    use axum::routing::get;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ProxyError::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    use prometheus::Encoder;
                    let mut buf = Vec::new();
                    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf);
                    String::from_utf8_lossy(&buf).to_string()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        // Ready once the runs are listed: a Service endpoint before that would answer 407 to
        // every run.
        .route(
            "/readyz",
            get(move || {
                let runs = Arc::clone(&runs);
                async move {
                    if runs.is_synced() {
                        (axum::http::StatusCode::OK, "ok")
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "runs not listed yet",
                        )
                    }
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bounds_are_short_for_heads_and_finite_for_tunnels() {
        let t = Timeouts::default();
        assert_eq!(t.head, Duration::from_secs(10));
        assert_eq!(t.idle, Duration::from_secs(300));
        let l = Limits::default();
        assert!(l.max_per_run + l.max_pending_per_source < l.max_connections);
        // One namespace's runs together hold at most a quarter of the proxy.
        assert!(l.max_per_run <= l.max_per_namespace);
        assert!(4 * l.max_per_namespace <= l.max_connections);
    }
}
