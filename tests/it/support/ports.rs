//! Loopback ports for the servers and proxies tests start next to the operator.

/// A loopback TCP port that was free a moment ago (bound, then released: good enough for a test
/// on a machine that is not handing out ports as fast as the tests take them).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}
