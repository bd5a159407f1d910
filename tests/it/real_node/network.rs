//! The network seen from the real node's pods: an echo server on a host address, what a probing
//! workload reports, the node's kubelet port.

use super::*;

/// An HTTP server on `ip` (a port outside the NodePort range, which kube-router lets through to
/// local addresses before any policy) answering every request with `<name> from <peer address>`;
/// the peers it served, in order.
pub(super) async fn echo_listener(
    ip: &str,
    name: &'static str,
) -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .unwrap_or_else(|e| panic!("listen on {ip}: {e}"));
    let addr = listener.local_addr().expect("local addr");
    assert!(
        !(30000..=32767).contains(&addr.port()),
        "{addr} is in the NodePort range"
    );
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = peers.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, peer)) = listener.accept().await {
            let peer = peer.ip().to_string();
            seen.lock().expect("peers").push(peer.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 64 * 1024 {
                    match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let body = format!("{name} from {peer}\n");
                let reply = format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr.to_string(), peers)
}

/// An IPv4 address of this host other than the real node's (its bridge's): pods reach it through
/// their gateway, so it is on the node network without being the node IP.
pub(super) fn other_host_address(node_ip: &str) -> String {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .expect("run ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next())
        .find(|a| *a != node_ip)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no global IPv4 address on this host besides {node_ip}"))
}

/// The termination message of a finished run as `name -> answer` (`ok …` or `fail …`).
pub(super) fn probe_lines(run: &SandboxRun) -> BTreeMap<String, String> {
    run.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The real node's kubelet port, as its Node says (the egress gate's default probe is the node's
/// kubelet port; the bed's is not 10250, which kwok has).
pub(super) async fn real_kubelet_port(client: &Client) -> i32 {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&bed_setting("SANDBOXRUN_TEST_REAL_NODE"))
        .await
        .expect("the real node");
    node.status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|k| k.port)
        .expect("the real node's kubelet port")
}

/// The workload of [`super::egress::a_filtered_runs_first_instruction_is_already_filtered`]: its FIRST
/// instruction connects to `$DENIED`, with no wait of any kind.
/// (It stays 5 s more, so that the test sees its pod's gate before the pod is deleted.)
pub(super) const FIRST_INSTRUCTION_PROBE: &str = r#"if r=$(/bin/busybox timeout 5 /bin/busybox wget -q -O - -Y off "http://$DENIED/" 2>&1); then echo "first=ok $r"; else echo "first=fail $r"; fi > /dev/termination-log; sleep 5"#;
