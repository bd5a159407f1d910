//! `sandboxrun-operator egress-proxy`: the forward proxy that enforces a run's host rules
//! (docs/contract.md "ADR-006 network rules: validated and enforced").
//!
//! - `CONNECT host:port` is a TLS passthrough (no interception): after the verdict, bytes are
//!   copied both ways as they come (`copy_bidirectional`, fixed buffers, no body is held);
//! - a plain-HTTP request with an absolute URI is forwarded with `Connection: close` and without
//!   the proxy's own headers, then streamed the same way (one request per connection);
//! - `Proxy-Authorization: Basic <run uid>:<token>` finds the run; a missing or wrong token is a
//!   407; the verdict is the admission matcher's ([`crate::admission::network::decide`]) on the
//!   run's CURRENT rules (a watch keeps them), and a refusal is a 403 whose body names the rule;
//! - a name that resolves to an address an IP/CIDR rule denies is refused too (so
//!   `!169.254.169.254` holds against a name pointing there);
//! - reading the request head, resolving and connecting each have a bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use prometheus::{opts, IntCounterVec, Registry};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::admission::network::{decide, Rule};
use crate::api::{NetworkMode, SandboxRun};
use crate::egress::mode::{egress_of, Egress};
use crate::egress::token;

/// Largest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;

/// Settings of `egress-proxy`. Every flag has an environment variable.
#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Address the proxy listens on.
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
    /// Bound on reading a request head.
    #[arg(long, env = "SANDBOXRUN_EGRESS_HEAD_TIMEOUT", default_value = "30s")]
    pub head_timeout: String,
    /// Bound on resolving a host name.
    #[arg(long, env = "SANDBOXRUN_EGRESS_RESOLVE_TIMEOUT", default_value = "5s")]
    pub resolve_timeout: String,
    /// Bound on connecting to the destination.
    #[arg(long, env = "SANDBOXRUN_EGRESS_CONNECT_TIMEOUT", default_value = "10s")]
    pub connect_timeout: String,
    /// Log format.
    #[arg(
        long,
        env = "SANDBOXRUN_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: crate::process::LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "SANDBOXRUN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
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
}

/// What the proxy knows of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRules {
    /// `namespace/name`, for logs and refusals.
    pub run: String,
    /// The mode.
    pub mode: NetworkMode,
    /// Its parsed rules.
    pub rules: Vec<Rule>,
}

impl RunRules {
    /// The rules of a run; None when its rules do not parse (every request is then refused with
    /// 407, the same as an unknown run: the run cannot have started).
    pub fn of(run: &SandboxRun) -> Option<RunRules> {
        let (mode, rules) = match egress_of(run).ok()? {
            Egress::Open => (NetworkMode::Open, Vec::new()),
            Egress::DenyAll => (NetworkMode::Allowlist, Vec::new()),
            Egress::Filtered { mode, rules } => (mode, rules),
        };
        Some(RunRules {
            run: format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any()),
            mode,
            rules,
        })
    }
}

/// The runs by uid, kept current by [`watch_runs`] (tests fill it directly).
#[derive(Default)]
pub struct RunTable {
    runs: RwLock<HashMap<String, Arc<RunRules>>>,
    /// Set once the first list is in: before it every token would be "unknown" (readiness).
    synced: std::sync::atomic::AtomicBool,
}

impl RunTable {
    /// Adds or replaces a run.
    pub fn upsert(&self, run: &SandboxRun) {
        let Some(uid) = run.metadata.uid.clone() else {
            return;
        };
        if let Ok(mut map) = self.runs.write() {
            match RunRules::of(run) {
                Some(r) => map.insert(uid, Arc::new(r)),
                None => map.remove(&uid),
            };
        }
    }

    /// Forgets a run.
    pub fn remove(&self, uid: &str) {
        if let Ok(mut map) = self.runs.write() {
            map.remove(uid);
        }
    }

    /// Replaces every run (a watch relist).
    pub fn replace(&self, runs: &[SandboxRun]) {
        let fresh: HashMap<String, Arc<RunRules>> = runs
            .iter()
            .filter_map(|r| Some((r.metadata.uid.clone()?, Arc::new(RunRules::of(r)?))))
            .collect();
        if let Ok(mut map) = self.runs.write() {
            *map = fresh;
        }
        self.synced.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the runs have been listed at least once.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The rules of the run with this uid.
    pub fn get(&self, uid: &str) -> Option<Arc<RunRules>> {
        self.runs.read().ok()?.get(uid).cloned()
    }

    /// Runs known.
    pub fn len(&self) -> usize {
        self.runs.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no run is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bounds of one request.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Reading the request head.
    pub head: Duration,
    /// Resolving the host.
    pub resolve: Duration,
    /// Connecting.
    pub connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            head: Duration::from_secs(30),
            resolve: Duration::from_secs(5),
            connect: Duration::from_secs(10),
        }
    }
}

/// Everything a connection needs.
pub struct ProxyState {
    /// Runs by uid.
    pub runs: Arc<RunTable>,
    /// The token secret.
    pub secret: Arc<[u8]>,
    /// Bounds.
    pub timeouts: Timeouts,
    /// `sandboxrun_egress_requests_total{verdict}`.
    pub requests: IntCounterVec,
}

/// Verdict labels of the metric.
pub mod verdict {
    /// Allowed and connected.
    pub(crate) const ALLOWED: &str = "allowed";
    /// Refused by the rules (403).
    pub(crate) const DENIED: &str = "denied";
    /// No or a wrong token (407).
    pub(crate) const UNAUTHENTICATED: &str = "unauthenticated";
    /// Malformed request (400) or an upstream that could not be reached (502/504).
    pub(crate) const ERROR: &str = "error";
}

impl ProxyState {
    /// A state with its metric (register [`ProxyState::requests`] to expose it).
    pub fn new(
        runs: Arc<RunTable>,
        secret: Arc<[u8]>,
        timeouts: Timeouts,
    ) -> Result<ProxyState, prometheus::Error> {
        let requests = IntCounterVec::new(
            opts!(
                "sandboxrun_egress_requests_total",
                "Egress proxy decisions, by verdict (allowed, denied, unauthenticated, error)"
            ),
            &["verdict"],
        )?;
        Ok(ProxyState {
            runs,
            secret,
            timeouts,
            requests,
        })
    }

    fn count(&self, verdict: &str) {
        self.requests.with_label_values(&[verdict]).inc();
    }
}

/// Accepts connections until `shutdown` resolves; each is served by its own task.
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
                Ok((stream, peer)) => {
                    let state = Arc::clone(&state);
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, &state).await {
                            debug!(%peer, error = %e, "egress connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head (the start of a body, or of the tunnel).
    rest: Vec<u8>,
}

async fn read_head(stream: &mut TcpStream) -> Result<Option<Head>, std::io::Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect(),
                    rest: buf[len..].to_vec(),
                };
                return Ok(Some(head));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

async fn respond(stream: &mut TcpStream, status: &str, extra: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// `host`, `port` of a CONNECT target (`host:port`, `[v6]:port`).
fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| (host.to_string(), port))
}

fn header<'a>(head: &'a Head, name: &str) -> Option<&'a [u8]> {
    head.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

async fn handle(mut client: TcpStream, state: &ProxyState) -> Result<(), std::io::Error> {
    let head = match tokio::time::timeout(state.timeouts.head, read_head(&mut client)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => {
            state.count(verdict::ERROR);
            respond(&mut client, "400 Bad Request", "", "malformed request\n").await;
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            state.count(verdict::ERROR);
            respond(
                &mut client,
                "408 Request Timeout",
                "",
                "request head timed out\n",
            )
            .await;
            return Ok(());
        }
    };

    // Who is asking.
    let run = header(&head, "proxy-authorization")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(token::parse_basic)
        .and_then(|(uid, tok)| {
            let run = state.runs.get(&uid)?;
            token::verify(&state.secret, &uid, &tok).then_some(run)
        });
    let Some(run) = run else {
        state.count(verdict::UNAUTHENTICATED);
        respond(
            &mut client,
            "407 Proxy Authentication Required",
            "Proxy-Authenticate: Basic realm=\"sandboxrun-egress\"\r\n",
            "this proxy serves SandboxRun pods only: use the HTTP_PROXY the operator set\n",
        )
        .await;
        return Ok(());
    };

    // Where to.
    let connect = head.method.eq_ignore_ascii_case("CONNECT");
    let (host, port, path) = if connect {
        match split_authority(&head.target) {
            Some((h, p)) => (h, p, String::new()),
            None => {
                state.count(verdict::ERROR);
                respond(
                    &mut client,
                    "400 Bad Request",
                    "",
                    "CONNECT wants host:port\n",
                )
                .await;
                return Ok(());
            }
        }
    } else {
        match url::Url::parse(&head.target) {
            Ok(u) if u.scheme() == "http" && u.host_str().is_some() => {
                let host = u.host_str().unwrap_or_default();
                let host = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host)
                    .to_string();
                let mut path = u.path().to_string();
                if let Some(q) = u.query() {
                    path.push('?');
                    path.push_str(q);
                }
                (host, u.port().unwrap_or(80), path)
            }
            _ => {
                state.count(verdict::ERROR);
                respond(
                    &mut client,
                    "400 Bad Request",
                    "",
                    "a proxied request is `CONNECT host:port` or an absolute http:// URI\n",
                )
                .await;
                return Ok(());
            }
        }
    };

    // The verdict on the name, then on every address it resolves to.
    let (allowed, by) = decide(run.mode, &run.rules, &host);
    if !allowed {
        return deny(&mut client, state, &run, &host, port, by, None).await;
    }
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(
        state.timeouts.resolve,
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        Ok(Err(e)) => {
            state.count(verdict::ERROR);
            let body = format!("cannot resolve {host}: {e}\n");
            respond(&mut client, "502 Bad Gateway", "", &body).await;
            return Ok(());
        }
        Err(_) => {
            state.count(verdict::ERROR);
            let body = format!("resolving {host} timed out\n");
            respond(&mut client, "504 Gateway Timeout", "", &body).await;
            return Ok(());
        }
    };
    let address_rules: Vec<(usize, Rule)> = run
        .rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_address())
        .map(|(i, r)| (i, r.clone()))
        .collect();
    let only: Vec<Rule> = address_rules.iter().map(|(_, r)| r.clone()).collect();
    for addr in &addrs {
        let ip = addr.ip().to_string();
        if let (false, Some(j)) = decide(run.mode, &only, &ip) {
            let by = address_rules.get(j).map(|(i, _)| *i);
            return deny(&mut client, state, &run, &host, port, by, Some(&ip)).await;
        }
    }

    // Connect (first address that answers, within the bound).
    let upstream = tokio::time::timeout(state.timeouts.connect, async {
        let mut last = None;
        for addr in &addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
    })
    .await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            state.count(verdict::ERROR);
            let body = format!("cannot connect to {host}:{port}: {e}\n");
            respond(&mut client, "502 Bad Gateway", "", &body).await;
            return Ok(());
        }
        Err(_) => {
            state.count(verdict::ERROR);
            let body = format!("connecting to {host}:{port} timed out\n");
            respond(&mut client, "504 Gateway Timeout", "", &body).await;
            return Ok(());
        }
    };
    let _ = upstream.set_nodelay(true);
    state.count(verdict::ALLOWED);
    debug!(run = %run.run, %host, port, connect, "egress allowed");

    if connect {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
    } else {
        let mut out = format!("{} {} HTTP/1.1\r\n", head.method, path).into_bytes();
        for (name, value) in &head.headers {
            let lower = name.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "proxy-authorization" | "proxy-connection" | "connection" | "keep-alive"
            ) {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        upstream.write_all(&out).await?;
    }
    if !head.rest.is_empty() {
        upstream.write_all(&head.rest).await?;
    }
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

async fn deny(
    client: &mut TcpStream,
    state: &ProxyState,
    run: &RunRules,
    host: &str,
    port: u16,
    by: Option<usize>,
    address: Option<&str>,
) -> Result<(), std::io::Error> {
    state.count(verdict::DENIED);
    let mode = match run.mode {
        NetworkMode::Allowlist => "allowlist",
        NetworkMode::Denylist => "denylist",
        NetworkMode::Open => "open",
    };
    let why = match by.and_then(|i| run.rules.get(i).map(|r| (i, r))) {
        Some((i, rule)) => format!("rule spec.network.rules[{i}] `{rule}`"),
        None => format!("the default of mode {mode} (no rule matches)"),
    };
    let target = match address {
        Some(a) => format!("{host}:{port} (resolved to {a})"),
        None => format!("{host}:{port}"),
    };
    warn!(run = %run.run, host, port, address, rule = %why, "egress denied");
    let body = format!(
        "egress to {target} denied by {why} of SandboxRun {}\n",
        run.run
    );
    respond(client, "403 Forbidden", "", &body).await;
    Ok(())
}

/// Keeps `table` equal to the runs the apiserver has (a relist replaces it whole).
pub(crate) async fn watch_runs(api: Api<SandboxRun>, table: Arc<RunTable>) {
    let mut init: Vec<SandboxRun> = Vec::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(run)) => table.upsert(&run),
            Ok(watcher::Event::Delete(run)) => {
                if let Some(uid) = run.metadata.uid.as_deref() {
                    table.remove(uid);
                }
            }
            Ok(watcher::Event::Init) => init.clear(),
            Ok(watcher::Event::InitApply(run)) => init.push(run),
            Ok(watcher::Event::InitDone) => {
                table.replace(&init);
                info!(runs = table.len(), "egress proxy: runs listed");
                init.clear();
            }
            Err(e) => warn!(error = %e, "watching SandboxRuns"),
        }
    }
}

/// Reads the token secret from a file (trailing newline dropped); refuses an empty one.
pub(crate) fn read_secret(path: &std::path::Path) -> Result<Arc<[u8]>, String> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let trimmed = raw
        .strip_suffix(b"\n")
        .map(|r| r.strip_suffix(b"\r").unwrap_or(r))
        .unwrap_or(&raw);
    if trimmed.len() < 16 {
        return Err(format!(
            "{}: the token secret is shorter than 16 bytes",
            path.display()
        ));
    }
    Ok(Arc::from(trimmed))
}

/// `sandboxrun-operator egress-proxy`.
pub async fn run(args: ProxyArgs) -> Result<(), ProxyError> {
    let secret = read_secret(&args.token_secret_file).map_err(ProxyError::Config)?;
    let dur = |flag: &str, text: &str| {
        crate::units::parse_duration(text).map_err(|e| ProxyError::Config(format!("{flag}: {e}")))
    };
    let timeouts = Timeouts {
        head: dur("--head-timeout", &args.head_timeout)?,
        resolve: dur("--resolve-timeout", &args.resolve_timeout)?,
        connect: dur("--connect-timeout", &args.connect_timeout)?,
    };
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
    } else {
        for ns in &namespaces {
            tokio::spawn(watch_runs(
                Api::namespaced(client.clone(), ns),
                Arc::clone(&table),
            ));
        }
    }
    let state = Arc::new(ProxyState::new(table, secret, timeouts)?);
    let registry = Registry::new();
    registry.register(Box::new(state.requests.clone()))?;
    serve_metrics(&args.metrics_addr, registry, Arc::clone(&state.runs)).await?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|source| ProxyError::Listen {
            addr: args.listen.clone(),
            source,
        })?;
    info!(addr = %args.listen, "egress proxy listening");
    serve(listener, state, crate::process::shutdown_signal()).await;
    Ok(())
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
    fn authorities_split() {
        assert_eq!(split_authority("a.com:443"), Some(("a.com".into(), 443)));
        assert_eq!(split_authority("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_authority("a.com"), None);
        assert_eq!(split_authority(":80"), None);
    }

    #[test]
    fn the_table_is_synced_by_the_first_list_only() {
        let table = RunTable::default();
        let mut run = SandboxRun::new("r", crate::api::SandboxRunSpec::default());
        run.metadata.uid = Some("u".into());
        table.upsert(&run);
        assert!(!table.is_synced(), "a single event is not a list");
        table.replace(&[]);
        assert!(table.is_synced());
        assert!(
            table.get("u").is_none(),
            "a relist replaces the table whole"
        );
    }

    #[test]
    fn the_metric_registers() {
        let state = ProxyState::new(
            Arc::new(RunTable::default()),
            Arc::from(b"0123456789abcdef".as_slice()),
            Timeouts::default(),
        )
        .unwrap();
        let registry = Registry::new();
        registry.register(Box::new(state.requests.clone())).unwrap();
        state.count(verdict::DENIED);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        assert_eq!(names, ["sandboxrun_egress_requests_total"]);
    }
}
