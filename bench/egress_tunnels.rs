//! The egress proxy's memory with many open tunnels, and under a flood of slow and idle
//! connections from one run (docs/performance.md "Egress proxy memory", "Egress proxy under a
//! flood"). Run by bench/egress_tunnels.sh, which measures the proxy process from outside.
//! Loopback only: the proxy listens on 127.0.0.1, run A's pod is 127.0.0.2, run B's 127.0.0.3.
//!
//!   egress_tunnels proxy                  serve on loopback (two runs allowed to 127.0.0.1),
//!                                         print `PORT <n> UID <uid> TOKEN <token> UID2 <uid>
//!                                         TOKEN2 <token>`, serve until killed. Production limits
//!                                         and timeouts, unless EGRESS_BENCH_MAX_PER_RUN /
//!                                         EGRESS_BENCH_UNLIMITED=1 say otherwise
//!   egress_tunnels clients <port> <uid> <token> <n>
//!                                         open n CONNECT tunnels from run A's pod to a local echo
//!                                         server through the proxy, check each echoes, print
//!                                         `READY`, hold them until stdin closes
//!   egress_tunnels flood <port> <uid> <token> <uid2> <token2> <n>
//!                                         from run A's pod open n connections (half stop in the
//!                                         middle of their head, half are tunnels left idle) while
//!                                         run B makes requests all along; print what the proxy held
//!                                         and refused and how B fared, then `READY`; hold until
//!                                         stdin closes
//!
//! The proxy here is `egress::proxy::serve` with a fixed run table: the same code as
//! `sandboxrun-operator egress-proxy` minus its watches of the apiserver.
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use sandboxrun_operator::api::{NetworkMode, NetworkPolicy, SandboxRun, SandboxRunSpec};
use sandboxrun_operator::egress::proxy::{bind, serve, Limits, ProxyState, RunTable, Timeouts};
use sandboxrun_operator::egress::token;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const SECRET: &[u8] = b"egress-tunnels-bench-secret-0123456789";
const UID: &str = "bench-run-uid";
const UID2: &str = "bench-other-run-uid";
const POD: &str = "127.0.0.2";
const POD2: &str = "127.0.0.3";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| -> Result<String, BoxError> {
        Ok(args.get(i).ok_or(format!("argument {i} missing"))?.clone())
    };
    match args.get(1).map(String::as_str) {
        Some("proxy") => proxy().await,
        Some("clients") => clients(arg(2)?.parse()?, &arg(3)?, &arg(4)?, arg(5)?.parse()?).await,
        Some("flood") => {
            let port: u16 = arg(2)?.parse()?;
            let a = (arg(3)?, arg(4)?);
            let b = (arg(5)?, arg(6)?);
            flood(port, a, b, arg(7)?.parse()?).await
        }
        _ => Err("usage: egress_tunnels proxy | clients <port> <uid> <token> <n> | flood <port> <uid> <token> <uid2> <token2> <n>".into()),
    }
}

fn add_run(table: &RunTable, name: &str, uid: &str, pod_ip: &str) {
    let mut run = SandboxRun::new(
        name,
        SandboxRunSpec {
            network: Some(NetworkPolicy {
                mode: NetworkMode::Allowlist,
                rules: vec!["127.0.0.1".into()],
            }),
            ..SandboxRunSpec::default()
        },
    );
    run.metadata.namespace = Some("bench".into());
    run.metadata.uid = Some(uid.into());
    table.upsert(&run);
    let mut pod = Pod {
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(pod_ip.into()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    };
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some("bench".into());
    pod.metadata.labels =
        Some([("sandbox.iterion.io/run-uid".to_string(), uid.to_string())].into());
    table.upsert_pod(&pod);
}

fn limits_from_env() -> Result<Limits, BoxError> {
    if std::env::var("EGRESS_BENCH_UNLIMITED").is_ok_and(|v| v == "1") {
        return Ok(Limits {
            max_connections: usize::MAX,
            max_per_run: usize::MAX,
            max_pending_per_source: usize::MAX,
            max_per_namespace: usize::MAX,
        });
    }
    let mut limits = Limits::default();
    if let Ok(n) = std::env::var("EGRESS_BENCH_MAX_PER_RUN") {
        // The clients open all their tunnels at once: as many heads may be pending.
        limits.max_per_run = n.parse()?;
        limits.max_pending_per_source = limits.max_per_run;
        limits.max_connections = limits.max_connections.max(2 * limits.max_per_run);
        // Both of the bench's runs are in one namespace: it measures the per-run bound.
        limits.max_per_namespace = limits.max_per_namespace.max(2 * limits.max_per_run);
    }
    Ok(limits)
}

async fn proxy() -> Result<(), BoxError> {
    let table = Arc::new(RunTable::default());
    add_run(&table, "bench", UID, POD);
    add_run(&table, "other", UID2, POD2);
    // Unlimited: the proxy as it was before its limits (a 30 s head timeout, no idle timeout).
    let unlimited = std::env::var("EGRESS_BENCH_UNLIMITED").is_ok_and(|v| v == "1");
    let timeouts = if unlimited {
        Timeouts {
            head: Duration::from_secs(30),
            idle: Duration::from_secs(86_400),
            ..Timeouts::default()
        }
    } else {
        Timeouts::default()
    };
    let state =
        ProxyState::new(table, Arc::from(SECRET), timeouts)?.with_limits(limits_from_env()?);
    let listener = bind("127.0.0.1:0", 1024)?;
    let port = listener.local_addr()?.port();
    println!(
        "PORT {port} UID {UID} TOKEN {} UID2 {UID2} TOKEN2 {}",
        token::token(SECRET, UID),
        token::token(SECRET, UID2)
    );
    serve(listener, Arc::new(state), futures::future::pending::<()>()).await;
    Ok(())
}

async fn echo_server() -> Result<SocketAddr, BoxError> {
    let echo = TcpListener::bind("127.0.0.1:0").await?;
    let target = echo.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Ok(target)
}

/// A connection to the proxy from the loopback address `source`.
async fn from(source: &str, port: u16) -> std::io::Result<TcpStream> {
    let ip: IpAddr = source
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ip, 0))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

/// CONNECT through `s`; the response head.
async fn connect_on(s: &mut TcpStream, target: SocketAddr, auth: &str) -> std::io::Result<Vec<u8>> {
    let req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await? == 0 {
            return Err(std::io::Error::other("closed"));
        }
        head.push(b[0]);
    }
    Ok(head)
}

/// A tunnel from `source` that echoes `msg`.
async fn echoed_tunnel(
    source: &str,
    port: u16,
    target: SocketAddr,
    auth: &str,
    msg: &[u8],
) -> std::io::Result<TcpStream> {
    let mut s = from(source, port).await?;
    let head = connect_on(&mut s, target, auth).await?;
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head).to_string(),
        ));
    }
    s.write_all(msg).await?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await?;
    Ok(s)
}

async fn clients(port: u16, uid: &str, tok: &str, n: usize) -> Result<(), BoxError> {
    let target = echo_server().await?;
    let auth = token::basic_header(uid, tok);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let auth = auth.clone();
        set.spawn(async move {
            let msg = format!("tunnel {i}");
            echoed_tunnel(POD, port, target, &auth, msg.as_bytes()).await
        });
    }
    let mut open = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        open.push(r??);
    }
    println!("READY {}", open.len());
    hold_until_stdin_closes(open).await;
    Ok(())
}

async fn hold_until_stdin_closes<T>(held: Vec<T>) {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {}
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held);
}

/// One flood connection: Some(stream) while the proxy holds it, None once refused.
async fn flood_one(i: usize, port: u16, target: SocketAddr, auth: &str) -> Option<TcpStream> {
    let mut s = from(POD, port).await.ok()?;
    if i.is_multiple_of(2) {
        // A slow head: its first line, then nothing.
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\n").as_bytes())
            .await
            .ok()?;
        let mut b = [0u8; 64];
        return match tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await {
            Err(_) => Some(s),
            Ok(_) => None,
        };
    }
    // An idle tunnel.
    let head = connect_on(&mut s, target, auth).await.ok()?;
    head.starts_with(b"HTTP/1.1 200").then_some(s)
}

async fn flood(
    port: u16,
    (uid, tok): (String, String),
    (uid2, tok2): (String, String),
    n: usize,
) -> Result<(), BoxError> {
    let target = echo_server().await?;
    let auth = token::basic_header(&uid, &tok);
    let auth2 = token::basic_header(&uid2, &tok2);
    // Run B works all along: one echoed tunnel after another.
    let flooding = Arc::new(AtomicBool::new(true));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let victim = {
        let (flooding, ok, failed) = (flooding.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            while flooding.load(Ordering::Relaxed) {
                let started = Instant::now();
                match echoed_tunnel(POD2, port, target, &auth2, b"b").await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                worst = worst.max(started.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            worst
        })
    };
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(512));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (auth, gate) = (auth.clone(), gate.clone());
        set.spawn(async move {
            let _permit = gate.acquire_owned().await.ok()?;
            flood_one(i, port, target, &auth).await
        });
    }
    let mut held = Vec::new();
    let mut refused = 0usize;
    while let Some(r) = set.join_next().await {
        match r.ok().flatten() {
            Some(s) => held.push(s),
            None => refused += 1,
        }
    }
    let elapsed = started.elapsed();
    flooding.store(false, Ordering::Relaxed);
    let worst = victim.await.unwrap_or_default();
    println!(
        "FLOOD n={n} held={} refused={refused} in {:.1} s; other run: {} ok, {} failed, slowest {} ms",
        held.len(),
        elapsed.as_secs_f64(),
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        worst.as_millis()
    );
    println!("READY {}", held.len());
    hold_until_stdin_closes(held).await;
    Ok(())
}
