//! `sandboxrun-operator egress-gate`: the init container that holds a filtered run's workload
//! until its NetworkPolicy is in force (`crate::inpod::gate`; docs/contract.md "A filtered run
//! never has an unfiltered instant").

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use crate::inpod::gate::ProbeTarget;

use clap::Args;

/// Arguments of `egress-gate`.
#[derive(Args, Debug)]
pub(crate) struct GateArgs {
    /// The probe's address: one the run's NetworkPolicy denies (the node's IP by default).
    #[arg(long, required_unless_present = "canary_port")]
    pub(crate) probe_host: Option<String>,
    /// The probe's port.
    #[arg(long, required_unless_present = "canary_port")]
    pub(crate) probe_port: Option<u16>,
    /// Probe the egress proxy's canary port at the anchor's host instead (needs `--anchor`): a
    /// listener known to answer that the run's policy never allows.
    #[arg(long, requires = "anchor")]
    pub(crate) canary_port: Option<u16>,
    /// The address ranges (CIDRs) the run's policy allows: when the anchor's address is in one,
    /// the policy may let the canary through, so the probe (`--probe-host`) is probed instead.
    #[arg(long, value_delimiter = ',', requires_all = ["canary_port", "probe_host", "probe_port"])]
    pub(crate) canary_unless_in: Vec<String>,
    /// How long the probe may stay reachable before the gate gives up (e.g. 60s).
    #[arg(long, default_value = crate::inpod::gate::DEFAULT_GATE_TIMEOUT)]
    pub(crate) timeout: String,
    /// A `host:port` the run's policy allows (the egress proxy): a denied probe opens the gate
    /// only while it answers.
    #[arg(long)]
    pub(crate) anchor: Option<String>,
}

/// Runs `egress-gate`: 0 once the probe is denied, 1 when it stayed reachable (the reason on
/// stderr, which the kubelet keeps as the container's termination message), 2 on bad flags.
pub(crate) async fn main(args: GateArgs) -> ExitCode {
    let probe = match probe_of(&args).await {
        Ok(probe) => probe,
        Err(e) => {
            eprintln!("egress gate: {e}");
            return ExitCode::from(2);
        }
    };
    let limit = match crate::units::parse_duration(&args.timeout) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("egress gate: --timeout: {e}");
            return ExitCode::from(2);
        }
    };
    let anchor = args.anchor.as_deref();
    match crate::inpod::gate::wait_until_denied(probe.clone(), anchor, limit).await {
        Ok(took) => {
            eprintln!(
                "egress gate: {probe} denied after {} ms; the NetworkPolicy is in force, starting the workload",
                took.as_millis()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Why the gate's flags name nothing to probe (a usage error: exit 2). The texts are the gate's
/// stderr, which the kubelet keeps as the container's termination message.
#[derive(Debug, PartialEq, thiserror::Error)]
enum FlagError {
    #[error("--anchor {0:?} is not host:port")]
    Anchor(String),
    #[error("--canary-unless-in {0:?}: {1}")]
    CanaryRange(String, crate::egress::network::RuleError),
    #[error("give --probe-host and --probe-port, or --canary-port with --anchor")]
    NoProbe,
    #[error("--probe-host {0:?} is not an IP address (the node's IP comes from the downward API)")]
    ProbeHost(String),
}

/// What the flags say to probe: the canary at the anchor's host — unless the anchor's address
/// is in a range the run allows (`--canary-unless-in`) — or the probe's address. An anchor that
/// does not resolve now keeps the canary (whose name then does not resolve either: the gate
/// cannot tell and stays shut).
async fn probe_of(args: &GateArgs) -> Result<ProbeTarget, FlagError> {
    if let (Some(canary), Some(anchor)) = (args.canary_port, args.anchor.as_deref()) {
        let named = crate::inpod::gate::canary_of(anchor, canary)
            .ok_or_else(|| FlagError::Anchor(anchor.to_string()))?;
        let ranges = args
            .canary_unless_in
            .iter()
            .map(|r| {
                crate::egress::network::Rule::parse(r)
                    .map_err(|e| FlagError::CanaryRange(r.clone(), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let addrs: Vec<IpAddr> = match tokio::net::lookup_host(anchor).await {
            Ok(found) => found.map(|a| a.ip()).collect(),
            Err(_) => Vec::new(),
        };
        if canary_applies(&addrs, &ranges) {
            return Ok(ProbeTarget::Named(named));
        }
    }
    let (Some(host), Some(port)) = (args.probe_host.as_deref(), args.probe_port) else {
        return Err(FlagError::NoProbe);
    };
    let host: IpAddr = host
        .trim()
        .parse()
        .map_err(|_| FlagError::ProbeHost(host.to_string()))?;
    Ok(ProbeTarget::Addr(SocketAddr::new(host, port)))
}

/// Whether the canary tells the policy apart: none of the anchor's addresses is in a range the
/// run's policy allows.
fn canary_applies(anchor: &[IpAddr], allowed: &[crate::egress::network::Rule]) -> bool {
    !anchor
        .iter()
        .any(|a| allowed.iter().any(|r| r.matches(&a.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;

    #[tokio::test]
    async fn the_gate_command_parses_what_the_pod_builder_writes_and_refuses_a_bad_host() {
        let gate = crate::inpod::gate::GateSettings {
            probe: crate::inpod::gate::GateProbe::Addr("127.0.0.1:9".parse().unwrap()),
            timeout: std::time::Duration::from_secs(5),
            anchor: true,
        };
        let mut argv = vec!["sandboxrun-operator".to_string()];
        argv.extend(gate.args(Some("proxy.sys.svc:3128"), None));
        let Ok(Command::EgressGate(args)) = Cli::try_parse_from(&argv).map(|c| c.command) else {
            panic!("{argv:?} does not parse as the gate");
        };
        assert_eq!(
            probe_of(&args).await,
            Ok(ProbeTarget::Addr("127.0.0.1:9".parse().unwrap()))
        );
        assert_eq!(args.anchor.as_deref(), Some("proxy.sys.svc:3128"));
        // With the proxy's canary: the canary at the anchor's host, no probe address.
        let mut argv = vec!["sandboxrun-operator".to_string()];
        let canary = crate::inpod::gate::Canary::port(3129);
        argv.extend(gate.args(Some("proxy.sys.svc:3128"), Some(&canary)));
        let Ok(Command::EgressGate(args)) = Cli::try_parse_from(&argv).map(|c| c.command) else {
            panic!("{argv:?} does not parse as the gate");
        };
        assert_eq!(
            probe_of(&args).await,
            Ok(ProbeTarget::Named("proxy.sys.svc:3129".to_string()))
        );
        // A run allowing address ranges: the canary where the anchor is outside them, the probe
        // where it is inside (the policy might let the canary through).
        for (range, want) in [
            (
                "192.0.2.0/24",
                ProbeTarget::Named("127.0.0.1:3129".to_string()),
            ),
            (
                "127.0.0.0/8",
                ProbeTarget::Addr("127.0.0.1:9".parse().unwrap()),
            ),
        ] {
            let canary = crate::inpod::gate::Canary {
                port: 3129,
                unless_in: vec![range.to_string()],
            };
            let mut argv = vec!["sandboxrun-operator".to_string()];
            argv.extend(gate.args(Some("127.0.0.1:3128"), Some(&canary)));
            let Ok(Command::EgressGate(args)) = Cli::try_parse_from(&argv).map(|c| c.command)
            else {
                panic!("{argv:?} does not parse as the gate");
            };
            assert_eq!(probe_of(&args).await, Ok(want), "{range}");
        }
        // A canary without an anchor is a usage error, not a gate that opens.
        let alone = [
            "sandboxrun-operator",
            "egress-gate",
            "--canary-port",
            "3129",
        ];
        assert!(Cli::try_parse_from(alone).is_err());
        let bad = GateArgs {
            probe_host: Some("$(SANDBOXRUN_HOST_IP)".to_string()),
            probe_port: Some(9),
            canary_port: None,
            canary_unless_in: Vec::new(),
            timeout: "5s".to_string(),
            anchor: None,
        };
        assert_eq!(main(bad).await, ExitCode::from(2));
    }
}
