//! The egress proxy for real on loopback (docs/contract.md "ADR-006 network rules: validated and
//! enforced"): a tunnel to an allowed host carries bytes intact both ways; a denied host is a 403
//! naming the rule; no or a wrong token is a 407; a rule change on the run takes effect on the
//! next request; a name resolving to a denied address is refused; plain HTTP is forwarded in
//! origin form without the proxy's credentials; 1,000 tunnels are held at once; curl works with
//! the URL the operator gives the workload.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxrun_operator::api::{NetworkMode, NetworkPolicy, SandboxRun, SandboxRunSpec};
use sandboxrun_operator::egress::env::proxy_url;
use sandboxrun_operator::egress::proxy::{serve, ProxyState, RunTable, Timeouts};
use sandboxrun_operator::egress::token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &[u8] = b"egress-proxy-test-secret-0123456789";

fn run(uid: &str, mode: NetworkMode, rules: &[&str]) -> SandboxRun {
    let mut run = SandboxRun::new(
        &format!("run-{uid}"),
        SandboxRunSpec {
            network: Some(NetworkPolicy {
                mode,
                rules: rules.iter().map(|r| r.to_string()).collect(),
            }),
            ..SandboxRunSpec::default()
        },
    );
    run.metadata.namespace = Some("ns".into());
    run.metadata.uid = Some(uid.into());
    run
}

struct Proxy {
    addr: SocketAddr,
    table: Arc<RunTable>,
    state: Arc<ProxyState>,
}

async fn proxy() -> Proxy {
    let table = Arc::new(RunTable::default());
    let state = Arc::new(
        ProxyState::new(
            Arc::clone(&table),
            Arc::from(SECRET),
            Timeouts {
                head: Duration::from_secs(5),
                resolve: Duration::from_secs(5),
                connect: Duration::from_secs(5),
            },
        )
        .expect("metric"),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(
        listener,
        Arc::clone(&state),
        futures::future::pending::<()>(),
    ));
    Proxy { addr, table, state }
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
    let mut s = TcpStream::connect(proxy).await.expect("connect to proxy");
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
    p.table
        .upsert(&run("u1", NetworkMode::Allowlist, &["127.0.0.1"]));
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
    p.table.upsert(&run(
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
    let p = proxy().await;
    let echo = echo_server().await;
    p.table.upsert(&run(
        "u3",
        NetworkMode::Allowlist,
        &["localhost", "!127.0.0.0/8"],
    ));
    let (_, head) = connect(
        p.addr,
        &format!("localhost:{}", echo.port()),
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
    p.table
        .upsert(&run("u4", NetworkMode::Allowlist, &["127.0.0.1"]));
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
    p.table
        .upsert(&run("u6", NetworkMode::Allowlist, &["127.0.0.1"]));
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    p.table
        .upsert(&run("u6", NetworkMode::Denylist, &["127.0.0.0/8"]));
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("rules[0] `127.0.0.0/8`"), "{head}");
    p.table.remove("u6");
    let (_, head) = connect(p.addr, &target, Some(&auth("u6"))).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form_without_the_proxy_credentials() {
    let p = proxy().await;
    // An upstream that answers with the request head it received.
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
    p.table
        .upsert(&run("u7", NetworkMode::Allowlist, &["127.0.0.1"]));
    let mut s = TcpStream::connect(p.addr).await.expect("connect");
    let req = format!(
        "GET http://{upstream}/path?q=1 HTTP/1.1\r\nHost: {upstream}\r\nProxy-Authorization: {}\r\nProxy-Connection: keep-alive\r\n\r\n",
        auth("u7")
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
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
    p.table
        .upsert(&run("u8", NetworkMode::Allowlist, &["127.0.0.1"]));
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
    let p = proxy().await;
    let echo = echo_server().await;
    p.table
        .upsert(&run("u9", NetworkMode::Allowlist, &["127.0.0.1"]));
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
