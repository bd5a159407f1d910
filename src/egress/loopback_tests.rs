//! The egress proxy in-process on loopback, for what the unit tests of [`crate::egress::limits`]
//! and [`crate::egress::runs`] decide (docs/contract.md "ADR-006 network rules: validated and
//! enforced"): one namespace's runs cannot take the proxy from another namespace, and a run's
//! tunnels close when it ends. The same shape as tests/it/egress_proxy.rs: the proxy binds
//! 127.0.0.1, each run's pod is a loopback source address, the upstream an echo server.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::api::{NetworkMode, NetworkPolicy, Phase, SandboxRun, SandboxRunStatus};
use crate::egress::limits::Limits;
use crate::egress::proxy::serve;
use crate::egress::runs::RunTable;
use crate::egress::state::{ProxyState, Timeouts};
use crate::egress::token;
use crate::pod::RUN_UID_LABEL;

const SECRET: &[u8] = b"egress-loopback-test-secret-0123456789";

/// A run of `namespace` allowed to reach 127.0.0.1 (the echo server).
fn run(namespace: &str, uid: &str) -> SandboxRun {
    crate::testkit::sandbox_run(&format!("run-{uid}"))
        .namespace(namespace)
        .uid(uid)
        .network(NetworkMode::Allowlist, &["127.0.0.1"])
        .build()
}

/// The run's pod, running at `ip`.
fn pod(namespace: &str, uid: &str, ip: &str) -> Pod {
    let mut pod = Pod {
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    pod.metadata.name = Some(format!("run-{uid}"));
    pod.metadata.namespace = Some(namespace.into());
    pod.metadata.labels = Some([(RUN_UID_LABEL.to_string(), uid.to_string())].into());
    pod
}

struct Proxy {
    addr: SocketAddr,
    table: Arc<RunTable>,
    state: Arc<ProxyState>,
}

impl Proxy {
    /// Serves `uid` of `namespace` to its pod at the loopback address `ip`.
    fn add(&self, namespace: &str, uid: &str, ip: &str) {
        self.table.upsert(&run(namespace, uid));
        self.table.upsert_pod(&pod(namespace, uid, ip));
    }
}

async fn proxy(limits: Limits) -> Proxy {
    let table = Arc::new(RunTable::default());
    let timeouts = Timeouts {
        head: Duration::from_secs(5),
        resolve: Duration::from_secs(5),
        connect: Duration::from_secs(5),
        idle: Duration::from_secs(60),
    };
    let state = ProxyState::new(Arc::clone(&table), Arc::from(SECRET), timeouts)
        .unwrap_or_else(|e| panic!("metrics: {e}"))
        .with_limits(limits);
    let state = Arc::new(state);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(serve(
        listener,
        Arc::clone(&state),
        futures::future::pending::<()>(),
    ));
    Proxy { addr, table, state }
}

/// An upstream that echoes every byte back.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
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

/// A CONNECT to `target` from the loopback address `source` with `uid`'s token: the stream and
/// the response head (with the body of a refusal).
async fn tunnel(
    proxy: SocketAddr,
    source: &str,
    uid: &str,
    target: SocketAddr,
) -> (TcpStream, String) {
    let socket = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    let ip: IpAddr = source.parse().unwrap_or_else(|e| panic!("{source}: {e}"));
    assert!(ip.is_loopback(), "tests stay on loopback");
    socket
        .bind(SocketAddr::new(ip, 0))
        .unwrap_or_else(|e| panic!("bind {source}: {e}"));
    let mut s = socket
        .connect(proxy)
        .await
        .unwrap_or_else(|e| panic!("connect to the proxy: {e}"));
    let auth = token::basic_header(uid, &token::token(SECRET, uid));
    let req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.unwrap_or(0);
        assert!(
            n > 0,
            "closed before answering: {:?}",
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

/// Sends `ping` through an open tunnel and reads the echo back.
async fn echoes(s: &mut TcpStream) -> bool {
    if s.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut back = [0u8; 4];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await,
        Ok(Ok(_))
    ) && &back == b"ping"
}

fn refused(state: &ProxyState, reason: &str) -> u64 {
    state.refused.with_label_values(&[reason]).get()
}

#[tokio::test]
async fn a_flooding_namespace_is_refused_past_its_share_while_another_namespace_is_served() {
    let p = proxy(Limits {
        max_connections: 64,
        max_per_run: 4,
        max_pending_per_source: 64,
        max_per_namespace: 6,
    })
    .await;
    let echo = echo_server().await;
    // Namespace `flood`: two runs, each within its own share; `calm`: one run.
    p.add("flood", "f1", "127.0.0.2");
    p.add("flood", "f2", "127.0.0.3");
    p.add("calm", "c1", "127.0.0.4");
    let mut held = Vec::new();
    for (source, uid, n) in [("127.0.0.2", "f1", 4), ("127.0.0.3", "f2", 2)] {
        for _ in 0..n {
            let (mut s, head) = tunnel(p.addr, source, uid, echo).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{uid}: {head}");
            assert!(echoes(&mut s).await, "{uid}");
            held.push(s);
        }
    }
    // f2 is under its run's share (2 of 4), but its namespace holds its 6.
    for _ in 0..3 {
        let (_, head) = tunnel(p.addr, "127.0.0.3", "f2", echo).await;
        assert!(
            head.starts_with("HTTP/1.1 429"),
            "over the namespace's share: {head}"
        );
        assert!(head.contains("runs of this namespace"), "{head}");
    }
    assert_eq!(refused(&p.state, "namespace_limit"), 3);
    // The other namespace is served all the same.
    let (mut s, head) = tunnel(p.addr, "127.0.0.4", "c1", echo).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "the other namespace: {head}"
    );
    assert!(echoes(&mut s).await, "calm's tunnel carries bytes");
    // The flood's tunnels still work: only its extra connections were refused.
    for s in held.iter_mut() {
        assert!(echoes(s).await, "a tunnel held within the share");
    }
}

#[tokio::test]
async fn a_runs_tunnel_is_closed_when_the_run_ends() {
    let p = proxy(Limits::default()).await;
    let echo = echo_server().await;
    p.add("ns", "r1", "127.0.0.2");
    p.add("ns", "r2", "127.0.0.3");
    let (mut ending, head) = tunnel(p.addr, "127.0.0.2", "r1", echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut other, head) = tunnel(p.addr, "127.0.0.3", "r2", echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(echoes(&mut ending).await && echoes(&mut other).await);
    // r1 ends (its teardown began): the watch reports its phase.
    let mut ended = run("ns", "r1");
    ended.status = Some(SandboxRunStatus {
        phase: Some(Phase::Draining),
        ..SandboxRunStatus::default()
    });
    p.table.upsert(&ended);
    // Bounded: a tunnel left open fails the test instead of hanging it.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(2), ending.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the ended run's tunnel is closed within 2 s: {closed:?}"
    );
    assert_eq!(p.state.run_ended_closed.get(), 1);
    assert!(echoes(&mut other).await, "another run's tunnel stays open");
    // Deleted: the same.
    p.table.remove("r2");
    let closed = tokio::time::timeout(Duration::from_secs(2), other.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    assert_eq!(p.state.run_ended_closed.get(), 2);
}

/// Issue #51 item 8: the run's rules were widened after its pod was created (with no webhook to
/// refuse the edit): its pod recorded the egress it started with, and the proxy judges by both,
/// so the widened target stays denied. On the old code the proxy judged by the run's live rules
/// alone and opened the tunnel.
#[tokio::test]
async fn an_edit_of_a_running_runs_rules_never_widens_its_egress() {
    let p = proxy(Limits::default()).await;
    let echo = echo_server().await;
    let mut widened = run("ns", "w1");
    widened.spec.network = Some(NetworkPolicy {
        mode: NetworkMode::Allowlist,
        rules: vec!["**".into(), "127.0.0.0/8".into()],
    });
    p.table.upsert(&widened);
    let started = NetworkPolicy {
        mode: NetworkMode::Allowlist,
        rules: vec!["api.example.com".into()],
    };
    let mut started_pod = pod("ns", "w1", "127.0.0.2");
    started_pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        containers: vec![k8s_openapi::api::core::v1::Container {
            name: crate::pod::HOLDER_CONTAINER.into(),
            env: crate::started::record_network(Some(&started)).map(|e| vec![e]),
            ..Default::default()
        }],
        ..Default::default()
    });
    p.table.upsert_pod(&started_pod);
    let (_, head) = tunnel(p.addr, "127.0.0.2", "w1", echo).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("started with"), "{head}");
    // Narrowing is always in force: the run's own rules still judge a pod that records wider.
    p.add("ns", "n1", "127.0.0.3");
    let mut narrowed = run("ns", "n1");
    narrowed.spec.network = Some(NetworkPolicy {
        mode: NetworkMode::Allowlist,
        rules: vec!["api.example.com".into()],
    });
    p.table.upsert(&narrowed);
    let (_, head) = tunnel(p.addr, "127.0.0.3", "n1", echo).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // A pod that records what its run allows is served.
    let mut same_pod = pod("ns", "s1", "127.0.0.4");
    same_pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        containers: vec![k8s_openapi::api::core::v1::Container {
            name: crate::pod::HOLDER_CONTAINER.into(),
            env: crate::started::record_network(run("ns", "s1").spec.network.as_ref())
                .map(|e| vec![e]),
            ..Default::default()
        }],
        ..Default::default()
    });
    p.table.upsert(&run("ns", "s1"));
    p.table.upsert_pod(&same_pod);
    let (mut s, head) = tunnel(p.addr, "127.0.0.4", "s1", echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(echoes(&mut s).await);
}

/// The egress gate's canary (docs/contract.md "A filtered run never has an unfiltered instant"):
/// it accepts and closes every connection at once, sending nothing, however many come.
#[tokio::test]
async fn the_canary_accepts_and_closes_every_connection_at_once() {
    let listener = crate::egress::proxy::bind("127.0.0.1:0", 64).expect("bind the canary");
    let addr = listener.local_addr().expect("canary address");
    let canary = tokio::spawn(crate::egress::proxy::serve_canary(listener));
    for _ in 0..200 {
        let mut conn = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("the canary answers");
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "nothing is sent: {read:?}"
        );
    }
    canary.abort();
}
