//! One connection of the egress proxy, step by step (src/egress/proxy.rs accepts it and gives it
//! its slot): the request head (bounded in time), who is asking (a live run, from its own pod),
//! the run's share of connections, where to, the verdict on the name and on every address it
//! resolves to, the upstream connection, then the relay until both sides close, it goes idle or
//! its run ends.
//! Each step either passes or is the [`Reply`] the connection gets.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::api::NetworkMode;
use crate::egress::head::{forward_head, fqdn, header, read_head, target_of, Head, Target};
use crate::egress::limits::{LimitRefusal, Slot};
use crate::egress::network::{decide, Rule};
use crate::egress::runs::{AuthRefusal, RunEnd, RunRules};
use crate::egress::state::{verdict, ProxyState, HEAD_TIMEOUT};
use crate::egress::token;
use crate::egress::tunnel::{relay, Ended};

/// What the proxy answers a connection it does not serve, and how it is counted.
#[derive(Debug)]
struct Reply {
    /// Status line; empty: close without answering (the peer is gone).
    status: &'static str,
    /// Extra header lines.
    extra: &'static str,
    body: String,
    verdict: &'static str,
    /// The `sandboxrun_egress_refused_total` reason, when it is one.
    reason: Option<&'static str>,
}

impl Reply {
    fn error(status: &'static str, body: impl Into<String>) -> Reply {
        Reply {
            status,
            extra: "",
            body: body.into(),
            verdict: verdict::ERROR,
            reason: None,
        }
    }

    fn gone() -> Reply {
        Reply::error("", "")
    }

    fn unauthenticated(why: AuthRefusal, run: Option<&str>) -> Reply {
        let body = match (why, run) {
            (AuthRefusal::RunEnded, Some(run)) => {
                format!("SandboxRun {run} has ended: its proxy token no longer opens anything\n")
            }
            (AuthRefusal::WrongSource, Some(run)) => format!(
                "this token is SandboxRun {run}'s and opens nothing from any pod but the run's\n"
            ),
            _ => "this proxy serves SandboxRun pods only: use the HTTP_PROXY the operator set\n"
                .to_string(),
        };
        Reply {
            status: "407 Proxy Authentication Required",
            extra: "Proxy-Authenticate: Basic realm=\"sandboxrun-egress\"\r\n",
            body,
            verdict: verdict::UNAUTHENTICATED,
            reason: Some(why.label()),
        }
    }

    fn limit(why: LimitRefusal) -> Reply {
        let status = match why {
            LimitRefusal::Run | LimitRefusal::Namespace => "429 Too Many Requests",
            LimitRefusal::Global | LimitRefusal::Source => "503 Service Unavailable",
        };
        let body = match why {
            LimitRefusal::Run => "this run holds as many proxy connections as it may\n",
            LimitRefusal::Namespace => {
                "the runs of this namespace hold as many proxy connections as they may\n"
            }
            _ => "the egress proxy is at capacity\n",
        };
        Reply {
            reason: Some(why.label()),
            ..Reply::error(status, body)
        }
    }
}

/// Writes a short answer and closes (bounded: a peer that does not read cannot keep it open).
async fn send(client: &mut TcpStream, state: &ProxyState, reply: Reply) {
    state.count(reply.verdict);
    if let Some(reason) = reply.reason {
        state.refuse(reason);
    }
    if reply.status.is_empty() {
        return;
    }
    let text = format!(
        "HTTP/1.1 {}\r\n{}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        reply.status,
        reply.extra,
        reply.body.len(),
        reply.body
    );
    let _ = tokio::time::timeout(state.timeouts.head, async {
        let _ = client.write_all(text.as_bytes()).await;
        let _ = client.shutdown().await;
    })
    .await;
}

/// A request that passed every check, with its upstream connected.
struct Ready {
    head: Head,
    target: Target,
    run: Arc<RunRules>,
    /// Fires when the run ends: the connection is closed then.
    end: RunEnd,
    upstream: TcpStream,
}

pub(crate) async fn handle(
    mut client: TcpStream,
    peer: SocketAddr,
    mut slot: Slot,
    state: &ProxyState,
) -> Result<(), std::io::Error> {
    match prepare(&mut client, peer, &mut slot, state).await {
        Ok(ready) => relay_allowed(client, ready, state).await,
        Err(reply) => {
            send(&mut client, state, reply).await;
            Ok(())
        }
    }
}

/// Head, authentication, the run's share, target, verdict, upstream: the first that fails is
/// the answer.
async fn prepare(
    client: &mut TcpStream,
    peer: SocketAddr,
    slot: &mut Slot,
    state: &ProxyState,
) -> Result<Ready, Reply> {
    let head = read_request(client, state).await?;
    let (uid, run) = authenticate(state, &head, peer).await?;
    // Taken after the run was seen live: a run that ends from here on closes the connection.
    let end = state.runs.run_end(&uid);
    slot.bind(&uid, &run.namespace).map_err(Reply::limit)?;
    let target = target_of(&head).map_err(|why| Reply::error("400 Bad Request", why))?;
    let addrs = judge(state, &run, &target).await?;
    let upstream = connect(state, &target, &addrs).await?;
    Ok(Ready {
        head,
        target,
        run,
        end,
        upstream,
    })
}

/// The request head, within the head timeout (counted from the accept).
async fn read_request(client: &mut TcpStream, state: &ProxyState) -> Result<Head, Reply> {
    match tokio::time::timeout(state.timeouts.head, read_head(client)).await {
        Ok(Ok(Some(head))) => Ok(head),
        Ok(Ok(None)) => Err(Reply::error("400 Bad Request", "malformed request\n")),
        Ok(Err(_)) => Err(Reply::gone()),
        Err(_) => Err(Reply {
            reason: Some(HEAD_TIMEOUT),
            ..Reply::error("408 Request Timeout", "request head timed out\n")
        }),
    }
}

/// The run whose verified token the request carries, if that run is live and `peer` is its pod
/// (waiting up to [`crate::egress::runs::LEARN_WAIT`] for the proxy to learn of either).
async fn authenticate(
    state: &ProxyState,
    head: &Head,
    peer: SocketAddr,
) -> Result<(String, Arc<RunRules>), Reply> {
    let verified = header(head, "proxy-authorization")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(token::parse_basic)
        .filter(|(uid, tok)| token::verify(&state.secret, uid, tok));
    let Some((uid, _)) = verified else {
        return Err(Reply::unauthenticated(AuthRefusal::BadCredentials, None));
    };
    let learnt = state
        .runs
        .authorize_soon(&uid, peer.ip(), crate::egress::runs::LEARN_WAIT);
    match learnt.await {
        Ok(run) => Ok((uid, run)),
        Err(why) => {
            let name = state.runs.get(&uid).map(|r| r.run.clone());
            warn!(run = name.as_deref(), %peer, reason = why.label(), "egress token refused");
            Err(Reply::unauthenticated(why, name.as_deref()))
        }
    }
}

/// The verdict on the name, then on every address it resolves to; the addresses when allowed.
async fn judge(
    state: &ProxyState,
    run: &RunRules,
    target: &Target,
) -> Result<Vec<SocketAddr>, Reply> {
    let (allowed, by) = decide(run.mode, &run.rules, &target.host, Some(target.port));
    if !allowed {
        return Err(denied(run, target, by, None));
    }
    // The egress its pod started with bounds it too (docs/contract.md "A teardown follows what
    // its run started with"): an edit of the run can narrow it, never widen it.
    let started = run.started.as_deref();
    if let Some(started) = started {
        if !decide(
            started.mode,
            &started.rules,
            &target.host,
            Some(target.port),
        )
        .0
        {
            return Err(denied_as_started(run, target, None));
        }
    }
    let addrs = resolve(state, target).await?;
    for addr in &addrs {
        let ip = addr.ip().to_string();
        if let Some(by) = address_denied(run.mode, &run.rules, &ip, target.port) {
            return Err(denied(run, target, by, Some(&ip)));
        }
        if let Some(started) = started {
            if address_denied(started.mode, &started.rules, &ip, target.port).is_some() {
                return Err(denied_as_started(run, target, Some(&ip)));
            }
        }
    }
    Ok(addrs)
}

/// Whether the address rules among `rules` deny `ip` (Some: the index of the rule that did,
/// within `rules`); a name's resolved address is judged by the address rules alone.
fn address_denied(mode: NetworkMode, rules: &[Rule], ip: &str, port: u16) -> Option<Option<usize>> {
    let address_rules: Vec<(usize, Rule)> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_address())
        .map(|(i, r)| (i, r.clone()))
        .collect();
    let only: Vec<_> = address_rules.iter().map(|(_, r)| r.clone()).collect();
    match decide(mode, &only, ip, Some(port)) {
        (false, Some(j)) => Some(address_rules.get(j).map(|(i, _)| *i)),
        _ => None,
    }
}

/// The 403 of a target the run's rules allow now but its pod's recorded egress does not.
fn denied_as_started(run: &RunRules, target: &Target, address: Option<&str>) -> Reply {
    let (host, port) = (&target.host, target.port);
    let shown = match address {
        Some(a) => format!("{host}:{port} (resolved to {a})"),
        None => format!("{host}:{port}"),
    };
    warn!(run = %run.run, %host, port, address, "egress denied by the network the run's pod started with");
    Reply {
        verdict: verdict::DENIED,
        ..Reply::error(
            "403 Forbidden",
            format!(
                "egress to {shown} denied by the spec.network SandboxRun {} started with (its \
                 rules changed after its pod was created; an edit never widens a running pod's \
                 egress)\n",
                run.run
            ),
        )
    }
}

/// The addresses of the target's host (an IP literal is its own), resolved fully qualified
/// within the bound.
async fn resolve(state: &ProxyState, target: &Target) -> Result<Vec<SocketAddr>, Reply> {
    let host = &target.host;
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, target.port)]);
    }
    let lookup = state.resolver.resolve(fqdn(host), target.port);
    match tokio::time::timeout(state.timeouts.resolve, lookup).await {
        Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
        Ok(Ok(_)) => Err(Reply::error(
            "502 Bad Gateway",
            format!("cannot resolve {host}: no address\n"),
        )),
        Ok(Err(e)) => Err(Reply::error(
            "502 Bad Gateway",
            format!("cannot resolve {host}: {e}\n"),
        )),
        Err(_) => Err(Reply::error(
            "504 Gateway Timeout",
            format!("resolving {host} timed out\n"),
        )),
    }
}

/// The first address that answers, within the bound.
async fn connect(
    state: &ProxyState,
    target: &Target,
    addrs: &[SocketAddr],
) -> Result<TcpStream, Reply> {
    let (host, port) = (&target.host, target.port);
    let attempt = tokio::time::timeout(state.timeouts.connect, async {
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
    })
    .await;
    match attempt {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(Reply::error(
            "502 Bad Gateway",
            format!("cannot connect to {host}:{port}: {e}\n"),
        )),
        Err(_) => Err(Reply::error(
            "504 Gateway Timeout",
            format!("connecting to {host}:{port} timed out\n"),
        )),
    }
}

/// The 403 of a denied target, naming the rule that decided (or the mode's default).
fn denied(run: &RunRules, target: &Target, by: Option<usize>, address: Option<&str>) -> Reply {
    let (host, port) = (&target.host, target.port);
    let mode = match run.mode {
        NetworkMode::Allowlist => "allowlist",
        NetworkMode::Denylist => "denylist",
        NetworkMode::Open => "open",
    };
    let why = match by.and_then(|i| run.rules.get(i).map(|r| (i, r))) {
        Some((i, rule)) => format!("rule spec.network.rules[{i}] `{rule}`"),
        None => format!("the default of mode {mode} (no rule matches)"),
    };
    let shown = match address {
        Some(a) => format!("{host}:{port} (resolved to {a})"),
        None => format!("{host}:{port}"),
    };
    warn!(run = %run.run, %host, port, address, rule = %why, "egress denied");
    Reply {
        verdict: verdict::DENIED,
        ..Reply::error(
            "403 Forbidden",
            format!(
                "egress to {shown} denied by {why} of SandboxRun {}\n",
                run.run
            ),
        )
    }
}

/// Answers the CONNECT (or forwards the plain-HTTP head), then relays until both sides close, the
/// connection goes idle or its run ends (docs/contract.md "ADR-006 network rules: validated and
/// enforced").
async fn relay_allowed(
    mut client: TcpStream,
    ready: Ready,
    state: &ProxyState,
) -> Result<(), std::io::Error> {
    let Ready {
        head,
        target,
        run,
        end,
        mut upstream,
    } = ready;
    state.count(verdict::ALLOWED);
    debug!(run = %run.run, host = %target.host, port = target.port, connect = target.connect, "egress allowed");
    let opening = async {
        if target.connect {
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await?;
        } else {
            upstream.write_all(&forward_head(&head, &target)).await?;
        }
        if !head.rest.is_empty() {
            upstream.write_all(&head.rest).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let end = end.ended();
    tokio::pin!(end);
    tokio::select! {
        opened = tokio::time::timeout(state.timeouts.idle, opening) => opened
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
        () = &mut end => {
            run_ended(state, &run, &target);
            return Ok(());
        }
    }
    let ended = tokio::select! {
        relayed = relay(client.split(), upstream.split(), state.timeouts.idle) => relayed?,
        () = &mut end => {
            run_ended(state, &run, &target);
            return Ok(());
        }
    };
    if ended == Ended::Idle {
        state.idle_closed.inc();
        debug!(run = %run.run, host = %target.host, "egress connection idle: closed");
    }
    Ok(())
}

/// Counts a connection closed because its run ended (both sockets close when dropped).
fn run_ended(state: &ProxyState, run: &RunRules, target: &Target) {
    state.run_ended_closed.inc();
    debug!(run = %run.run, host = %target.host, "egress connection closed: its run ended");
}
