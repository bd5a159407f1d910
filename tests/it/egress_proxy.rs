//! The egress proxy for real on loopback (docs/contract.md "ADR-006 network rules: validated and
//! enforced"): a tunnel to an allowed host carries bytes intact both ways; a denied host is a 403
//! naming the rule; no or a wrong token is a 407, and so is a valid token of an ended run or from
//! another address than the run's pod; a rule change on the run takes effect on the next request;
//! a name resolving to a denied address is refused; names are resolved fully qualified; plain
//! HTTP is forwarded in origin form without the proxy's credentials and with the URI's host as
//! `Host`; a rule without a port allows every port; slow heads, idle tunnels and one run's
//! connections cannot starve another run; 1,000 tunnels are held at once; curl works with the URL
//! the operator gives the workload.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use sandboxrun_operator::api::{NetworkMode, Phase, SandboxRun, SandboxRunStatus};
use sandboxrun_operator::egress::env::proxy_url;
use sandboxrun_operator::egress::proxy::{serve, Limits, ProxyState, Resolve, RunTable, Timeouts};
use sandboxrun_operator::egress::token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::support::sandbox_run;

const SECRET: &[u8] = b"egress-proxy-test-secret-0123456789";
const RUN_UID_LABEL: &str = "sandbox.iterion.io/run-uid";

/// The run `run-<uid>` of namespace `ns` whose network is `mode` with `rules`.
fn filtered_run(uid: &str, mode: NetworkMode, rules: &[&str]) -> SandboxRun {
    sandbox_run(&format!("run-{uid}"))
        .namespace("ns")
        .uid(uid)
        .network(mode, rules)
        .build()
}

/// The run's pod, running at `ip`.
fn pod(uid: &str, ip: &str) -> Pod {
    let mut pod = Pod {
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    pod.metadata.name = Some(format!("run-{uid}"));
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.labels = Some([(RUN_UID_LABEL.to_string(), uid.to_string())].into());
    pod
}

struct Proxy {
    addr: SocketAddr,
    table: Arc<RunTable>,
    state: Arc<ProxyState>,
}

impl Proxy {
    /// Serves `run` to its pod at 127.0.0.1 (where the tests connect from).
    fn add(&self, run: SandboxRun) {
        self.add_at(run, "127.0.0.1");
    }

    fn add_at(&self, run: SandboxRun, pod_ip: &str) {
        let uid = run.metadata.uid.clone().expect("uid");
        self.table.upsert(&run);
        self.table.upsert_pod(&pod(&uid, pod_ip));
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        head: Duration::from_secs(5),
        resolve: Duration::from_secs(5),
        connect: Duration::from_secs(5),
        idle: Duration::from_secs(60),
    }
}

async fn proxy() -> Proxy {
    proxy_with(timeouts(), Limits::default(), None).await
}

async fn proxy_with(
    timeouts: Timeouts,
    limits: Limits,
    resolver: Option<Arc<dyn Resolve>>,
) -> Proxy {
    let table = Arc::new(RunTable::default());
    let mut state = ProxyState::new(Arc::clone(&table), Arc::from(SECRET), timeouts)
        .expect("metric")
        .with_limits(limits);
    if let Some(r) = resolver {
        state = state.with_resolver(r);
    }
    let state = Arc::new(state);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(
        listener,
        Arc::clone(&state),
        futures::future::pending::<()>(),
    ));
    Proxy { addr, table, state }
}

/// A resolver with fixed answers that records every name it is asked.
#[derive(Default)]
struct FixedResolver {
    names: HashMap<String, IpAddr>,
    asked: Mutex<Vec<String>>,
}

impl Resolve for FixedResolver {
    fn resolve(
        &self,
        name: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> {
        self.asked.lock().expect("lock").push(name.clone());
        let found = self
            .names
            .get(&name)
            .map(|ip| vec![SocketAddr::new(*ip, port)]);
        Box::pin(async move { found.ok_or_else(|| std::io::Error::other("no such name")) })
    }
}

/// An upstream that echoes every byte back.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

fn auth(uid: &str) -> String {
    token::basic_header(uid, &token::token(SECRET, uid))
}

/// Sends a CONNECT and returns the stream and the response head (and any body, for refusals).
async fn connect(proxy: SocketAddr, target: &str, auth: Option<&str>) -> (TcpStream, String) {
    let s = TcpStream::connect(proxy).await.expect("connect to proxy");
    tunnel_on(s, target, auth).await
}

/// A connection to the proxy from the loopback address `source` (127.0.0.0/8 only).
async fn from(source: &str, proxy: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    let ip: IpAddr = source.parse().expect("source");
    assert!(ip.is_loopback(), "tests stay on loopback");
    socket.bind(SocketAddr::new(ip, 0)).expect("bind source");
    socket.connect(proxy).await.expect("connect to proxy")
}

/// [`connect`] on a connection already open.
async fn tunnel_on(mut s: TcpStream, target: &str, auth: Option<&str>) -> (TcpStream, String) {
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.expect("read head");
        assert!(
            n > 0,
            "proxy closed before answering: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let mut text = String::from_utf8_lossy(&head).to_string();
    if !text.starts_with("HTTP/1.1 200") {
        let mut body = String::new();
        let _ = s.read_to_string(&mut body).await;
        text.push_str(&body);
    }
    (s, text)
}

fn counter(state: &ProxyState, verdict: &str) -> u64 {
    state.requests.with_label_values(&[verdict]).get()
}

#[tokio::test]
async fn an_allowed_tunnel_carries_4_mib_each_way_intact() {
    let p = proxy().await;
    let echo = echo_server().await;
    p.add(filtered_run("u1", NetworkMode::Allowlist, &["127.0.0.1"]));
    let (s, head) = connect(p.addr, &echo.to_string(), Some(&auth("u1"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let payload: Vec<u8> = (0..4 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (mut r, mut w) = s.into_split();
    let sent = payload.clone();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.expect("send");
        w.shutdown().await.expect("half-close");
    });
    let mut back = Vec::with_capacity(payload.len());
    r.read_to_end(&mut back).await.expect("receive");
    writer.await.expect("writer");
    assert_eq!(back.len(), payload.len());
    assert!(back == payload, "bytes changed in the tunnel");
    println!(
        "4 MiB each way through the proxy in {:?}",
        started.elapsed()
    );
    assert_eq!(counter(&p.state, "allowed"), 1);
}

#[tokio::test]
async fn a_denied_host_is_a_403_naming_the_rule() {
    let p = proxy().await;
    let echo = echo_server().await;
    p.add(filtered_run(
        "u2",
        NetworkMode::Allowlist,
        &["127.0.0.1", "**.example.com", "!localhost"],
    ));
    let (_, head) = connect(
        p.addr,
        &format!("localhost:{}", echo.port()),
        Some(&auth("u2")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.contains("spec.network.rules[2] `!localhost`"),
        "the refusal names the rule: {head}"
    );
    assert!(head.contains("ns/run-u2"), "{head}");
    // No rule matches: the mode's default decides, and the body says so.
    let (_, head) = connect(p.addr, "example.org:443", Some(&auth("u2"))).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("the default of mode allowlist"), "{head}");
    assert_eq!(counter(&p.state, "denied"), 2);
}

#[tokio::test]
async fn a_name_resolving_to_a_denied_address_is_refused() {
    let resolver = FixedResolver {
        names: [("internal.test.".to_string(), IpAddr::from([127, 0, 0, 1]))].into(),
        ..FixedResolver::default()
    };
    let p = proxy_with(timeouts(), Limits::default(), Some(Arc::new(resolver))).await;
    let echo = echo_server().await;
    p.add(filtered_run(
        "u3",
        NetworkMode::Allowlist,
        &["internal.test", "!127.0.0.0/8"],
    ));
    let (_, head) = connect(
        p.addr,
        &format!("internal.test:{}", echo.port()),
        Some(&auth("u3")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("rules[1] `!127.0.0.0/8`"), "{head}");
    assert!(head.contains("resolved to 127.0.0.1"), "{head}");
}

#[tokio::test]
async fn no_token_a_wrong_token_or_an_unknown_run_is_a_407() {
    let p = proxy().await;
    let echo = echo_server().await;
    p.add(filtered_run("u4", NetworkMode::Allowlist, &["127.0.0.1"]));
    let target = echo.to_string();
    let (_, head) = connect(p.addr, &target, None).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(head.contains("Proxy-Authenticate: Basic"), "{head}");
    let wrong = token::basic_header("u4", &token::token(b"another-secret-xxxxxxxx", "u4"));
    let (_, head) = connect(p.addr, &target, Some(&wrong)).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    // Another run's token does not open this run's rules.
    let swapped = token::basic_header("u4", &token::token(SECRET, "u5"));
    let (_, head) = connect(p.addr, &target, Some(&swapped)).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    // A valid token of a run the proxy does not know (deleted).
    let (_, head) = connect(p.addr, &target, Some(&auth("gone"))).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert_eq!(counter(&p.state, "unauthenticated"), 4);
    assert_eq!(counter(&p.state, "allowed"), 0);
}

#[tokio::test]
async fn a_rule_change_on_the_run_takes_effect_on_the_next_request() {
    let p = proxy().await;
    let echo = echo_server().await;
    let target = echo.to_string();
    p.add(filtered_run("u6", NetworkMode::Allowlist, &["127.0.0.1"]));
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    p.add(filtered_run("u6", NetworkMode::Denylist, &["127.0.0.0/8"]));
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("rules[0] `127.0.0.0/8`"), "{head}");
    p.table.remove("u6");
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
}

/// Sends `req` to the proxy at `addr` and reads the answer to its end.
async fn exchange(addr: std::net::SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// An upstream that answers one request with the request head it received.
async fn head_echo_upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.expect("read") == 0 {
                break;
            }
            head.push(byte[0]);
        }
        let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", head.len());
        s.write_all(reply.as_bytes()).await.expect("write");
        s.write_all(&head).await.expect("write");
    });
    upstream
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_the_proxy_credentials() {
    let p = proxy().await;
    // An upstream that answers with the request head it received.
    let upstream = head_echo_upstream().await;
    p.add(filtered_run("u7", NetworkMode::Allowlist, &["127.0.0.1"]));
    let req = format!(
        "GET http://{upstream}/path?q=1 HTTP/1.1\r\nHost: {upstream}\r\nProxy-Authorization: {}\r\nProxy-Connection: keep-alive\r\n\r\n",
        auth("u7")
    );
    let out = exchange(p.addr, &req).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("GET /path?q=1 HTTP/1.1\r\n"), "{out}");
    assert!(
        !out.to_ascii_lowercase().contains("proxy-authorization"),
        "{out}"
    );
    assert!(
        !out.to_ascii_lowercase().contains("proxy-connection"),
        "{out}"
    );
    assert!(out.contains("Connection: close"), "{out}");
}

#[tokio::test]
async fn curl_works_with_the_url_the_operator_gives_the_workload() {
    let p = proxy().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                )
                .await;
        }
    });
    p.add(filtered_run("u8", NetworkMode::Allowlist, &["127.0.0.1"]));
    let url = proxy_url(
        &format!("http://{}", p.addr),
        "u8",
        &token::token(SECRET, "u8"),
    )
    .expect("proxy url");
    let curl = |target: String, tunnel: bool| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"]);
            if tunnel {
                cmd.arg("--proxytunnel");
            }
            cmd.env_clear()
                .env("http_proxy", &url)
                .env("HTTPS_PROXY", &url)
                .arg(target)
                .output()
                .expect("run curl")
        })
    };
    for tunnel in [false, true] {
        let out = curl(format!("http://{upstream}/"), tunnel)
            .await
            .expect("curl task");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            text.ends_with("hello\n200"),
            "tunnel={tunnel}: {text} {out:?}"
        );
    }
    // A denied host: curl sees the proxy's 403.
    let out = curl("http://localhost:9/".to_string(), false)
        .await
        .expect("curl task");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.ends_with("403"), "{text}");
    assert!(
        text.contains("denied by the default of mode allowlist"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tunnels_are_held_at_once() {
    const TUNNELS: usize = 1000;
    let limits = Limits {
        max_connections: 2 * TUNNELS,
        max_per_run: TUNNELS,
        // All 1,000 connect at once, before the proxy reads any head.
        max_pending_per_source: TUNNELS,
        max_per_namespace: TUNNELS,
    };
    let p = proxy_with(timeouts(), limits, None).await;
    let echo = echo_server().await;
    p.add(filtered_run("u9", NetworkMode::Allowlist, &["127.0.0.1"]));
    let target = echo.to_string();
    let started = Instant::now();
    let mut open = Vec::with_capacity(TUNNELS);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..TUNNELS {
        let target = target.clone();
        let addr = p.addr;
        tasks.spawn(async move {
            let (mut s, head) = connect(addr, &target, Some(&auth("u9"))).await;
            assert!(head.starts_with("HTTP/1.1 200"), "tunnel {i}: {head}");
            let msg = format!("tunnel {i}\n");
            s.write_all(msg.as_bytes()).await.expect("write");
            let mut back = vec![0u8; msg.len()];
            s.read_exact(&mut back).await.expect("read");
            assert_eq!(back, msg.as_bytes());
            s
        });
    }
    while let Some(s) = tasks.join_next().await {
        open.push(s.expect("tunnel task"));
    }
    assert_eq!(open.len(), TUNNELS);
    // All still open: each still echoes.
    for (i, s) in open.iter_mut().enumerate().step_by(97) {
        s.write_all(b"again").await.expect("write");
        let mut back = [0u8; 5];
        s.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"again", "tunnel {i}");
    }
    println!(
        "{TUNNELS} concurrent tunnels opened and checked in {:?}",
        started.elapsed()
    );
    assert_eq!(counter(&p.state, "allowed"), TUNNELS as u64);
}

/// Waits (at most 5 s) until the proxy holds `n` connections.
async fn wait_for_connections(state: &ProxyState, n: i64) {
    for _ in 0..500 {
        if state.connections.get() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn refused(state: &ProxyState, reason: &str) -> u64 {
    state.refused.with_label_values(&[reason]).get()
}

/// Reads what the proxy sends until it closes (at most 5 s: the old proxy never closed).
async fn read_until_closed(s: &mut TcpStream) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).to_string()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn plain_http_is_forwarded_with_the_uri_host_never_the_clients_host_header() {
    let p = proxy().await;
    let upstream = head_echo_upstream().await;
    // Allowed: 127.0.0.1. The Host header names a host the rules deny.
    p.add(filtered_run("h1", NetworkMode::Allowlist, &["127.0.0.1"]));
    let req = format!(
        "GET http://{upstream}/ HTTP/1.1\r\nHost: metadata.google.internal\r\nProxy-Authorization: {}\r\n\r\n",
        auth("h1")
    );
    let out = exchange(p.addr, &req).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(
        out.contains(&format!("\r\nHost: {upstream}\r\n")),
        "the upstream is told the host the verdict was on: {out}"
    );
    assert!(!out.contains("metadata.google.internal"), "{out}");
}

#[tokio::test]
async fn a_rule_without_a_port_allows_every_port_of_its_host() {
    let p = proxy().await;
    let (a, b) = (echo_server().await, echo_server().await);
    p.add(filtered_run("p1", NetworkMode::Allowlist, &["127.0.0.1"]));
    for target in [a, b] {
        let (_, head) = connect(p.addr, &target.to_string(), Some(&auth("p1"))).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}");
    }
}

#[tokio::test]
async fn a_token_opens_nothing_once_its_run_is_torn_down_or_ended() {
    let p = proxy().await;
    let echo = echo_server().await;
    let target = echo.to_string();
    let mut r = filtered_run("e1", NetworkMode::Allowlist, &["127.0.0.1"]);
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Running),
        ..SandboxRunStatus::default()
    });
    p.add(r.clone());
    let (_, head) = connect(p.addr, &target, Some(&auth("e1"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "running: {head}");
    for phase in [
        Phase::Draining,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Stopped,
    ] {
        r.status = Some(SandboxRunStatus {
            phase: Some(phase),
            ..SandboxRunStatus::default()
        });
        p.add(r.clone());
        let (_, head) = connect(p.addr, &target, Some(&auth("e1"))).await;
        assert!(head.starts_with("HTTP/1.1 407"), "{phase:?}: {head}");
        assert!(head.contains("ns/run-e1 has ended"), "{head}");
    }
    assert_eq!(refused(&p.state, "run_ended"), 4);
    assert_eq!(counter(&p.state, "allowed"), 1);
}

#[tokio::test]
async fn a_token_opens_nothing_from_an_address_that_is_not_its_runs_pod() {
    let p = proxy().await;
    let echo = echo_server().await;
    let target = echo.to_string();
    p.add_at(
        filtered_run("s1", NetworkMode::Allowlist, &["127.0.0.1"]),
        "127.0.0.2",
    );
    // Another pod (127.0.0.3) with the run's valid token.
    let s = from("127.0.0.3", p.addr).await;
    let (_, head) = tunnel_on(s, &target, Some(&auth("s1"))).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(head.contains("from any pod but the run's"), "{head}");
    assert_eq!(refused(&p.state, "wrong_source"), 1);
    // The run's own pod.
    let s = from("127.0.0.2", p.addr).await;
    let (_, head) = tunnel_on(s, &target, Some(&auth("s1"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn names_are_resolved_fully_qualified_never_through_the_search_list() {
    let resolver = Arc::new(FixedResolver::default());
    let p = proxy_with(
        timeouts(),
        Limits::default(),
        Some(Arc::clone(&resolver) as Arc<dyn Resolve>),
    )
    .await;
    p.add(filtered_run(
        "f1",
        NetworkMode::Allowlist,
        &["github.com", "127.0.0.1"],
    ));
    let (_, head) = connect(p.addr, "github.com:443", Some(&auth("f1"))).await;
    assert!(
        head.starts_with("HTTP/1.1 502"),
        "the fixed resolver knows no name: {head}"
    );
    let echo = echo_server().await;
    let (_, head) = connect(p.addr, &echo.to_string(), Some(&auth("f1"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let asked = resolver.asked.lock().expect("lock").clone();
    assert_eq!(
        asked,
        ["github.com."],
        "`github.com` must never become service `github` in namespace `com` (an IP is not resolved)"
    );
}

#[tokio::test]
async fn a_slow_head_is_cut_at_the_head_timeout_and_counted() {
    let p = proxy_with(
        Timeouts {
            head: Duration::from_millis(300),
            ..timeouts()
        },
        Limits::default(),
        None,
    )
    .await;
    let mut s = TcpStream::connect(p.addr).await.expect("connect");
    s.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")
        .await
        .expect("write");
    let out = read_until_closed(&mut s).await;
    assert!(
        out.as_deref()
            .is_some_and(|o| o.starts_with("HTTP/1.1 408")),
        "{out:?}"
    );
    assert_eq!(refused(&p.state, "head_timeout"), 1);
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_and_counted() {
    let p = proxy_with(
        Timeouts {
            idle: Duration::from_millis(300),
            ..timeouts()
        },
        Limits::default(),
        None,
    )
    .await;
    let echo = echo_server().await;
    p.add(filtered_run("i1", NetworkMode::Allowlist, &["127.0.0.1"]));
    let (mut s, head) = connect(p.addr, &echo.to_string(), Some(&auth("i1"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"ping").await.expect("write");
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.expect("echo");
    let out = read_until_closed(&mut s).await;
    assert_eq!(out.as_deref(), Some(""), "closed without a byte more");
    assert_eq!(p.state.idle_closed.get(), 1);
    assert_eq!(p.state.connections.get(), 0, "its slot came back");
}

#[tokio::test]
async fn one_run_and_its_pod_cannot_take_the_proxy_from_another_run() {
    let limits = Limits {
        max_connections: 64,
        max_per_run: 4,
        max_pending_per_source: 3,
        max_per_namespace: 64,
    };
    let p = proxy_with(timeouts(), limits, None).await;
    let echo = echo_server().await;
    let target = echo.to_string();
    p.add_at(
        filtered_run("greedy", NetworkMode::Allowlist, &["127.0.0.1"]),
        "127.0.0.2",
    );
    p.add_at(
        filtered_run("other", NetworkMode::Allowlist, &["127.0.0.1"]),
        "127.0.0.3",
    );
    // The greedy pod: 4 tunnels (its share), then heads it never finishes.
    let mut held = Vec::new();
    for _ in 0..4 {
        let s = from("127.0.0.2", p.addr).await;
        let (s, head) = tunnel_on(s, &target, Some(&auth("greedy"))).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(s);
    }
    let s = from("127.0.0.2", p.addr).await;
    let (_, head) = tunnel_on(s, &target, Some(&auth("greedy"))).await;
    assert!(
        head.starts_with("HTTP/1.1 429"),
        "over its run's share: {head}"
    );
    wait_for_connections(&p.state, 4).await;
    for _ in 0..3 {
        held.push(from("127.0.0.2", p.addr).await);
    }
    // The proxy has accepted the silent heads before the next one.
    wait_for_connections(&p.state, 7).await;
    let mut extra = from("127.0.0.2", p.addr).await;
    let out = read_until_closed(&mut extra).await;
    assert!(
        out.as_deref()
            .is_some_and(|o| o.is_empty() || o.starts_with("HTTP/1.1 503")),
        "a 4th silent head from one source is refused at once: {out:?}"
    );
    // The other run is served all the same.
    for _ in 0..4 {
        let s = from("127.0.0.3", p.addr).await;
        let (mut s, head) = tunnel_on(s, &target, Some(&auth("other"))).await;
        assert!(head.starts_with("HTTP/1.1 200"), "the other run: {head}");
        s.write_all(b"ok").await.expect("write");
        let mut back = [0u8; 2];
        s.read_exact(&mut back).await.expect("echo");
        held.push(s);
    }
    assert_eq!(refused(&p.state, "run_limit"), 1);
    assert_eq!(refused(&p.state, "source_limit"), 1);
}

#[tokio::test]
async fn the_global_limit_refuses_at_once_and_frees_with_the_connections() {
    let limits = Limits {
        max_connections: 3,
        max_per_run: 10,
        max_pending_per_source: 10,
        max_per_namespace: 10,
    };
    let p = proxy_with(timeouts(), limits, None).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(p.addr).await.expect("connect"));
    }
    wait_for_connections(&p.state, 3).await;
    let mut extra = TcpStream::connect(p.addr).await.expect("connect");
    let out = read_until_closed(&mut extra).await;
    assert!(
        out.as_deref()
            .is_some_and(|o| o.is_empty() || o.starts_with("HTTP/1.1 503")),
        "{out:?}"
    );
    assert_eq!(refused(&p.state, "global_limit"), 1);
    held.clear();
    wait_for_connections(&p.state, 0).await;
    assert_eq!(
        p.state.connections.get(),
        0,
        "closed connections give their slots back"
    );
}

#[tokio::test]
async fn a_rule_with_a_port_allows_that_port_only() {
    let resolver = FixedResolver {
        names: [("echo.test.".to_string(), IpAddr::from([127, 0, 0, 1]))].into(),
        ..FixedResolver::default()
    };
    let p = proxy_with(timeouts(), Limits::default(), Some(Arc::new(resolver))).await;
    let (a, b) = (echo_server().await, echo_server().await);
    let rule = format!("echo.test:{}", a.port());
    p.add(filtered_run("p2", NetworkMode::Allowlist, &[rule.as_str()]));
    let (_, head) = connect(
        p.addr,
        &format!("echo.test:{}", a.port()),
        Some(&auth("p2")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, head) = connect(
        p.addr,
        &format!("echo.test:{}", b.port()),
        Some(&auth("p2")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "another port: {head}");
    assert!(head.contains("the default of mode allowlist"), "{head}");
}
