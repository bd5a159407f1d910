//! The egress proxy's memory with many open tunnels (docs/performance.md "Egress proxy memory").
//! Run by bench/egress_tunnels.sh, which measures the proxy process from outside:
//!
//!   egress_tunnels proxy                  serve on loopback (one run allowed to 127.0.0.1), print
//!                                         `PORT <n> UID <uid> TOKEN <token>`, serve until killed
//!   egress_tunnels clients <port> <uid> <token> <n>
//!                                         open n CONNECT tunnels to a local echo server through
//!                                         the proxy, check each echoes, print `READY`, hold them
//!                                         until stdin closes
//!
//! The proxy here is `egress::proxy::serve` with a fixed run table: the same code as
//! `sandboxrun-operator egress-proxy` minus its watch of the apiserver.
use std::sync::Arc;
use std::time::Duration;

use sandboxrun_operator::api::{NetworkMode, NetworkPolicy, SandboxRun, SandboxRunSpec};
use sandboxrun_operator::egress::proxy::{serve, ProxyState, RunTable, Timeouts};
use sandboxrun_operator::egress::token;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &[u8] = b"egress-tunnels-bench-secret-0123456789";
const UID: &str = "bench-run-uid";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("proxy") => proxy().await,
        Some("clients") => {
            let port: u16 = args.get(2).ok_or("port")?.parse()?;
            let uid = args.get(3).ok_or("uid")?.clone();
            let tok = args.get(4).ok_or("token")?.clone();
            let n: usize = args.get(5).ok_or("n")?.parse()?;
            clients(port, &uid, &tok, n).await
        }
        _ => Err("usage: egress_tunnels proxy | clients <port> <uid> <token> <n>".into()),
    }
}

async fn proxy() -> Result<(), Box<dyn std::error::Error>> {
    let table = Arc::new(RunTable::default());
    let mut run = SandboxRun::new(
        "bench",
        SandboxRunSpec {
            network: Some(NetworkPolicy {
                mode: NetworkMode::Allowlist,
                rules: vec!["127.0.0.1".into()],
            }),
            ..SandboxRunSpec::default()
        },
    );
    run.metadata.namespace = Some("bench".into());
    run.metadata.uid = Some(UID.into());
    table.upsert(&run);
    let state = Arc::new(ProxyState::new(
        table,
        Arc::from(SECRET),
        Timeouts::default(),
    )?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    println!("PORT {port} UID {UID} TOKEN {}", token::token(SECRET, UID));
    serve(listener, state, futures::future::pending::<()>()).await;
    Ok(())
}

async fn clients(
    port: u16,
    uid: &str,
    tok: &str,
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
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
    let auth = token::basic_header(uid, tok);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let auth = auth.clone();
        set.spawn(async move {
            let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
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
            if !head.starts_with(b"HTTP/1.1 200") {
                return Err(std::io::Error::other(format!(
                    "tunnel {i}: {}",
                    String::from_utf8_lossy(&head)
                )));
            }
            let msg = format!("tunnel {i}");
            s.write_all(msg.as_bytes()).await?;
            let mut back = vec![0u8; msg.len()];
            s.read_exact(&mut back).await?;
            Ok::<TcpStream, std::io::Error>(s)
        });
    }
    let mut open = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        open.push(r??);
    }
    println!("READY {}", open.len());
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {}
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(open);
    Ok(())
}
