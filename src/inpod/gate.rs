//! The egress gate (docs/contract.md "A filtered run never has an unfiltered instant"): the first
//! init container of every pod whose run restricts egress. A network plugin programs a pod's
//! NetworkPolicy only after the pod has an address, so a workload that started at once could
//! reach what its policy denies in its first second. The gate, the operator's own code in the
//! operator's image, connects to a probe address the run's policy denies (by default the node's
//! kubelet port, which every node that can be exec'd into serves) until the connection is
//! refused, then exits 0 and the workload starts. Still reachable after its bound: it exits 1
//! with the reason as its termination message, and the run fails with `EgressNotEnforced`.
//!
//! A probe that does not answer proves nothing by itself: the pod's network may not be up yet.
//! When the run's policy allows the egress proxy (a filtered run with a proxy configured), the
//! gate is given it as its **anchor** (`--anchor host:port`): a denied probe opens the gate only
//! in a round where the anchor answered; an anchor that does not answer is "cannot tell", which
//! keeps the gate shut, up to the same bound and a clear failure (issue #38).
//!
//! A denied probe still cannot be told from a probe where nothing listens or a host firewall
//! drops: the node's kubelet port closed or firewalled for pods would open the gate at once. So
//! when the proxy serves a **canary** port (`egress-proxy --canary-listen`) and the run's policy
//! allows no address range (so nothing but its policy decides whether the canary is reached), the
//! gate probes the canary at the anchor's own host: the same process listens on both ports, the
//! run's policy allows the one and never the other, so a refused canary beside an answering
//! anchor is the policy and nothing else (docs/contract.md "A filtered run never has an
//! unfiltered instant").

use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

/// The gate's container name.
pub(crate) const GATE_CONTAINER: &str = "egress-gate";
/// The subcommand the gate runs (`crate::cmd::gate`).
pub(crate) const SUBCOMMAND: &str = "egress-gate";
/// The gate's env variable holding the node's IP (downward API `status.hostIP`).
pub(crate) const HOST_IP_ENV: &str = "SANDBOXRUN_HOST_IP";
/// Bound of one connection attempt: a policy that drops (rather than rejects) is seen as a
/// timeout.
pub(crate) const TRY_TIMEOUT: Duration = Duration::from_millis(700);
/// Pause between two attempts that reached the probe.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What the gate probes (`run --egress-gate-probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateProbe {
    /// The node's IP (the pod's `status.hostIP`) at this port: `node:<port>`.
    Node(u16),
    /// A fixed address: `<ip>:<port>`, `[<ipv6>]:<port>`.
    Addr(SocketAddr),
}

/// The gate's settings; `None` in [`crate::egress::EgressSettings::gate`] turns it off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateSettings {
    /// What to probe.
    pub probe: GateProbe,
    /// How long the probe may stay reachable before the run fails.
    pub timeout: Duration,
    /// Whether a filtered run's gate is given the egress proxy as its anchor
    /// (`run --egress-gate-anchor`, on by default).
    pub anchor: bool,
}

/// Default of `run --egress-gate-probe`: the kubelet's port on the pod's node.
pub const DEFAULT_GATE_PROBE: &str = "node:10250";
/// Default of `run --egress-gate-timeout`.
pub const DEFAULT_GATE_TIMEOUT: &str = "60s";

/// A `--egress-gate-probe` value that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("--egress-gate-probe {0:?}: want off, node:<port> or <ip>:<port>")]
pub struct ProbeError(pub String);

/// Parses `--egress-gate-probe`: `off` (None), `node:<port>` or a socket address.
pub fn parse_probe(text: &str) -> Result<Option<GateProbe>, ProbeError> {
    let text = text.trim();
    if text == "off" {
        return Ok(None);
    }
    let bad = || ProbeError(text.to_string());
    if let Some(port) = text.strip_prefix("node:") {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return (port != 0)
            .then_some(Some(GateProbe::Node(port)))
            .ok_or_else(bad);
    }
    let addr: SocketAddr = text.parse().map_err(|_| bad())?;
    (addr.port() != 0)
        .then_some(Some(GateProbe::Addr(addr)))
        .ok_or_else(bad)
}

/// The egress proxy's canary for an anchored gate: its port, and the address ranges the run's
/// policy allows (`unless_in`, CIDRs): where the anchor's address falls in one of them, the
/// policy may let the canary through, so the gate probes the node instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Canary {
    /// The proxy's canary port.
    pub port: u16,
    /// Address ranges that send the gate to the probe when the anchor is in one of them (`--canary-unless-in`: written by earlier
    /// versions, whose run policies did not deny the proxy's pods; empty from this one).
    pub unless_in: Vec<String>,
}

impl Canary {
    /// The canary at `port`, probed whatever ranges the run allows.
    pub(crate) fn port(port: u16) -> Canary {
        Canary {
            port,
            unless_in: Vec::new(),
        }
    }
}

impl GateSettings {
    /// The gate container's arguments after its program (`<binary>`): the probe, with the node's
    /// IP as `$(SANDBOXRUN_HOST_IP)` for the kubelet to expand, the bound, and the anchor (a
    /// `host:port` the run's policy allows: the egress proxy) when there is one. With an anchor
    /// and a `canary` the gate probes the canary at the anchor's host instead of the probe
    /// (with `unless_in`, only when the anchor's address is in none of those ranges: the probe is
    /// then given too).
    pub(crate) fn args(&self, anchor: Option<&str>, canary: Option<&Canary>) -> Vec<String> {
        let mut args = vec![SUBCOMMAND.to_string()];
        let canary = canary.filter(|_| anchor.is_some());
        if let Some(canary) = canary {
            args.extend(["--canary-port".to_string(), canary.port.to_string()]);
            if !canary.unless_in.is_empty() {
                args.extend(["--canary-unless-in".to_string(), canary.unless_in.join(",")]);
            }
        }
        match canary {
            Some(c) if c.unless_in.is_empty() => {}
            _ => {
                let (host, port) = match self.probe {
                    GateProbe::Node(port) => (format!("$({HOST_IP_ENV})"), port),
                    GateProbe::Addr(addr) => (addr.ip().to_string(), addr.port()),
                };
                args.extend([
                    "--probe-host".to_string(),
                    host,
                    "--probe-port".to_string(),
                    port.to_string(),
                ]);
            }
        }
        args.extend([
            "--timeout".to_string(),
            format!("{}s", self.timeout.as_secs().max(1)),
        ]);
        if let Some(anchor) = anchor {
            args.extend(["--anchor".to_string(), anchor.to_string()]);
        }
        args
    }
}

/// What one connection attempt to the probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The probe answered: the policy is not in force for this pod yet.
    Reached,
    /// Refused, unreachable or timed out: the policy denies it.
    Denied,
    /// A probe named by host name whose name did not resolve: nothing was tried.
    Unresolved,
}

/// What the gate probes: a fixed address (the node's, or the flag's), or the proxy's canary
/// port by the anchor's host name (`host:port`, resolved on each attempt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProbeTarget {
    /// A socket address.
    Addr(SocketAddr),
    /// A `host:port` to resolve.
    Named(String),
}

impl std::fmt::Display for ProbeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeTarget::Addr(a) => write!(f, "{a}"),
            ProbeTarget::Named(n) => write!(f, "{n}"),
        }
    }
}

/// The canary's `host:port`: the anchor's host (`host:port`) at `canary`; None when the anchor
/// has no port.
pub(crate) fn canary_of(anchor: &str, canary: u16) -> Option<String> {
    let (host, _) = anchor.rsplit_once(':')?;
    (!host.is_empty()).then(|| format!("{host}:{canary}"))
}

/// What the gate does after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateStep {
    /// The policy is in force: let the workload start.
    Open,
    /// Try again after [`RETRY_PAUSE`].
    Retry,
    /// The bound passed without seeing the policy in force: fail the run.
    GiveUp(Stuck),
}

/// Why the gate could not see the policy in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stuck {
    /// The probe answered.
    ProbeReachable,
    /// The probe did not answer, and neither did the anchor: the network may just not be up.
    CannotTell,
}

/// The gate's rule on one round: `probe` is what the probe found, `anchor` what the anchor (a
/// listener the policy allows) found, None when the gate has none. Open only on a denied probe
/// with the anchor reached (or no anchor); otherwise retry while within `limit`.
pub(crate) fn next_step(
    probe: Attempt,
    anchor: Option<Attempt>,
    elapsed: Duration,
    limit: Duration,
) -> GateStep {
    let stuck = match (probe, anchor) {
        (Attempt::Denied, None | Some(Attempt::Reached)) => return GateStep::Open,
        (Attempt::Reached, _) => Stuck::ProbeReachable,
        (Attempt::Unresolved, _)
        | (Attempt::Denied, Some(Attempt::Denied | Attempt::Unresolved)) => Stuck::CannotTell,
    };
    if elapsed >= limit {
        GateStep::GiveUp(stuck)
    } else {
        GateStep::Retry
    }
}

/// Why the gate kept the workload from starting.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GateError {
    /// The probe stayed reachable.
    #[error(
        "egress gate: {probe} was still reachable after {secs}s ({attempts} attempts), so this pod's NetworkPolicy was not seen in force and the workload was not started; check that the network plugin enforces NetworkPolicy (run --network-policy), that no rule of the run allows {probe} (run --egress-gate-probe), and that no other NetworkPolicy of the namespace allows it (policies add up)"
    )]
    StillReachable {
        /// The probe address.
        probe: ProbeTarget,
        /// Seconds waited.
        secs: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// The anchor never answered while the probe was denied: no sign the network works.
    #[error(
        "egress gate: the egress proxy {anchor}, which this run's NetworkPolicy allows, did not answer in {secs}s ({attempts} attempts), so a denied probe ({probe}) could not be told from a network that is not up and the workload was not started; check that the egress proxy runs and that the network plugin enforces NetworkPolicy (run --network-policy)"
    )]
    CannotTell {
        /// The anchor, as given.
        anchor: String,
        /// The probe address.
        probe: ProbeTarget,
        /// Seconds waited.
        secs: u64,
        /// Attempts made.
        attempts: u32,
    },
}

/// One attempt: a TCP connection to `probe` within [`TRY_TIMEOUT`].
async fn attempt(probe: SocketAddr) -> Attempt {
    match tokio::time::timeout(TRY_TIMEOUT, tokio::net::TcpStream::connect(probe)).await {
        Ok(Ok(_)) => Attempt::Reached,
        Ok(Err(_)) | Err(_) => Attempt::Denied,
    }
}

/// One attempt at a named target (`host:port`, resolved each time): Reached when any of its
/// addresses answers within [`TRY_TIMEOUT`]; a name that does not resolve is Unresolved.
async fn attempt_named(target: &str) -> Attempt {
    let resolved = tokio::time::timeout(TRY_TIMEOUT, tokio::net::lookup_host(target)).await;
    let Ok(Ok(addrs)) = resolved else {
        return Attempt::Unresolved;
    };
    for addr in addrs {
        if attempt(addr).await == Attempt::Reached {
            return Attempt::Reached;
        }
    }
    Attempt::Denied
}

/// Probes `probe` (and `anchor`, when given) until the probe is denied while the anchor
/// answers (Ok: how long it took) or `limit` passes.
pub(crate) async fn wait_until_denied(
    probe: ProbeTarget,
    anchor: Option<&str>,
    limit: Duration,
) -> Result<Duration, GateError> {
    let start = tokio::time::Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts = attempts.saturating_add(1);
        let found = match &probe {
            ProbeTarget::Addr(addr) => attempt(*addr).await,
            ProbeTarget::Named(name) => attempt_named(name).await,
        };
        let anchored = match anchor {
            Some(a) if found == Attempt::Denied => Some(attempt_named(a).await),
            _ => None,
        };
        let secs = start.elapsed().as_secs();
        match next_step(found, anchored, start.elapsed(), limit) {
            GateStep::Open => return Ok(start.elapsed()),
            GateStep::GiveUp(Stuck::ProbeReachable) => {
                return Err(GateError::StillReachable {
                    probe: probe.clone(),
                    secs,
                    attempts,
                })
            }
            GateStep::GiveUp(Stuck::CannotTell) => {
                return Err(GateError::CannotTell {
                    anchor: anchor.unwrap_or_default().to_string(),
                    probe: probe.clone(),
                    secs,
                    attempts,
                })
            }
            GateStep::Retry => tokio::time::sleep(RETRY_PAUSE).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn the_gate_opens_on_the_first_denied_attempt_and_gives_up_only_past_its_bound() {
        let limit = Duration::from_secs(60);
        let early = Duration::from_secs(1);
        assert_eq!(
            next_step(Attempt::Denied, None, early, limit),
            GateStep::Open
        );
        assert_eq!(
            next_step(Attempt::Reached, None, early, limit),
            GateStep::Retry
        );
        assert_eq!(
            next_step(Attempt::Reached, None, limit, limit),
            GateStep::GiveUp(Stuck::ProbeReachable)
        );
        // Denied at the very end still opens: the policy is in force.
        assert_eq!(
            next_step(Attempt::Denied, None, limit * 2, limit),
            GateStep::Open
        );
    }

    #[test]
    fn a_denied_probe_opens_the_gate_only_when_the_anchor_answers() {
        let limit = Duration::from_secs(60);
        let early = Duration::from_secs(1);
        let (reached, denied) = (Some(Attempt::Reached), Some(Attempt::Denied));
        assert_eq!(
            next_step(Attempt::Denied, reached, early, limit),
            GateStep::Open
        );
        // Nothing answers at all: the network may not be up; cannot tell is shut.
        assert_eq!(
            next_step(Attempt::Denied, denied, early, limit),
            GateStep::Retry
        );
        assert_eq!(
            next_step(Attempt::Denied, denied, limit, limit),
            GateStep::GiveUp(Stuck::CannotTell)
        );
        assert_eq!(
            next_step(Attempt::Reached, reached, early, limit),
            GateStep::Retry
        );
        assert_eq!(
            next_step(Attempt::Reached, reached, limit, limit),
            GateStep::GiveUp(Stuck::ProbeReachable)
        );
    }

    #[tokio::test]
    async fn a_closed_probe_opens_the_gate_only_once_the_anchor_answers() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        // A port nothing listens on: the probe and an anchor there are both refused.
        let closed = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let dead_anchor = format!("127.0.0.1:{closed}");
        let shut = wait_until_denied(
            ProbeTarget::Addr(SocketAddr::new(loopback, closed)),
            Some(&dead_anchor),
            Duration::from_millis(600),
        )
        .await;
        assert!(
            matches!(shut, Err(GateError::CannotTell { attempts, .. }) if attempts >= 2),
            "nothing answers: cannot tell, so shut: {shut:?}"
        );
        let anchor = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live_anchor = anchor.local_addr().unwrap().to_string();
        let open = wait_until_denied(
            ProbeTarget::Addr(SocketAddr::new(loopback, closed)),
            Some(&live_anchor),
            Duration::from_secs(5),
        )
        .await;
        assert!(
            open.is_ok(),
            "the anchor answers and the probe is denied: {open:?}"
        );
    }

    #[test]
    fn probes_parse_as_off_node_port_or_address() {
        assert_eq!(parse_probe("off"), Ok(None));
        assert_eq!(parse_probe("node:10250"), Ok(Some(GateProbe::Node(10250))));
        assert_eq!(
            parse_probe("10.0.0.1:80"),
            Ok(Some(GateProbe::Addr("10.0.0.1:80".parse().unwrap())))
        );
        assert_eq!(
            parse_probe("[fd00::1]:443"),
            Ok(Some(GateProbe::Addr("[fd00::1]:443".parse().unwrap())))
        );
        for bad in [
            "",
            "node:",
            "node:0",
            "node:x",
            "example.com:80",
            "10.0.0.1",
            "1.2.3.4:0",
        ] {
            assert!(parse_probe(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_node_probe_is_expanded_by_the_kubelet_from_the_host_ip_variable() {
        let gate = GateSettings {
            probe: GateProbe::Node(11250),
            timeout: Duration::from_secs(30),
            anchor: true,
        };
        assert_eq!(
            gate.args(None, Some(&Canary::port(3129))),
            [
                "egress-gate",
                "--probe-host",
                "$(SANDBOXRUN_HOST_IP)",
                "--probe-port",
                "11250",
                "--timeout",
                "30s"
            ]
        );
    }

    #[tokio::test]
    async fn a_listening_probe_keeps_the_gate_shut_and_a_closed_one_opens_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        });
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let probe = ProbeTarget::Addr(SocketAddr::new(loopback, port));
        let shut = wait_until_denied(probe.clone(), None, Duration::from_millis(600)).await;
        assert!(
            matches!(shut, Err(GateError::StillReachable { attempts, .. }) if attempts >= 2),
            "{shut:?}"
        );
        accept.abort();
        let _ = accept.await;
        // Nothing listens now (the listener was dropped with its task): refused, so open.
        let open = wait_until_denied(probe, None, Duration::from_secs(5)).await;
        assert!(open.is_ok(), "{open:?}");
    }

    /// Issue #38 item 4: a probe where nothing listens reads as "denied", so a node whose
    /// kubelet port is closed (or firewalled for pods) opened the gate with no policy in force.
    /// The canary is the proxy's own second listener, known to answer: while nothing but a
    /// policy stands between the pod and it, it is reached and the gate stays shut.
    #[tokio::test]
    async fn a_canary_beside_the_anchor_keeps_the_gate_shut_until_refused_where_a_dead_probe_opened_it(
    ) {
        let anchor = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let canary = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let anchor_at = anchor.local_addr().unwrap().to_string();
        let canary_port = canary.local_addr().unwrap().port();
        // The node's probe with nothing listening (no policy anywhere): it opens at once.
        let dead = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let opened = wait_until_denied(
            ProbeTarget::Addr(dead),
            Some(&anchor_at),
            Duration::from_secs(5),
        )
        .await;
        assert!(opened.is_ok(), "a dead probe reads as denied: {opened:?}");
        // The canary on the anchor's host: it answers (no policy), so the gate stays shut.
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = canary.accept().await {
                drop(conn);
            }
        });
        let gate = GateSettings {
            probe: GateProbe::Node(10250),
            timeout: Duration::from_secs(1),
            anchor: true,
        };
        let args = gate.args(Some(&anchor_at), Some(&Canary::port(canary_port)));
        assert!(!args.contains(&"--probe-host".to_string()), "{args:?}");
        let target = ProbeTarget::Named(canary_of(&anchor_at, canary_port).unwrap());
        let shut =
            wait_until_denied(target.clone(), Some(&anchor_at), Duration::from_millis(600)).await;
        assert!(
            matches!(shut, Err(GateError::StillReachable { attempts, .. }) if attempts >= 2),
            "the canary answers: the policy is not in force: {shut:?}"
        );
        // The policy in force, as the canary's refusal beside the answering anchor.
        accept.abort();
        let _ = accept.await;
        let open = wait_until_denied(target, Some(&anchor_at), Duration::from_secs(5)).await;
        assert!(open.is_ok(), "{open:?}");
        // A canary whose name does not resolve is "cannot tell", never open.
        let unresolved = wait_until_denied(
            ProbeTarget::Named("no-such-host.invalid:3129".to_string()),
            Some(&anchor_at),
            Duration::from_millis(300),
        )
        .await;
        assert!(
            matches!(unresolved, Err(GateError::CannotTell { .. })),
            "{unresolved:?}"
        );
        drop(anchor);
    }

    #[test]
    fn the_canary_is_the_anchors_host_at_the_canary_port() {
        assert_eq!(
            canary_of("proxy.sys.svc:3128", 3129).as_deref(),
            Some("proxy.sys.svc:3129")
        );
        assert_eq!(
            canary_of("[fd00::1]:3128", 9).as_deref(),
            Some("[fd00::1]:9")
        );
        assert_eq!(canary_of("proxy", 9), None);
        assert_eq!(canary_of(":3128", 9), None);
    }
}
