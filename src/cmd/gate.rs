//! `sandboxrun-operator egress-gate`: the init container that holds a filtered run's workload
//! until its NetworkPolicy is in force (`crate::inpod::gate`; docs/contract.md "A filtered run
//! never has an unfiltered instant").

use std::net::IpAddr;
use std::process::ExitCode;

use clap::Args;

/// Arguments of `egress-gate`.
#[derive(Args, Debug)]
pub(crate) struct GateArgs {
    /// The probe's address: one the run's NetworkPolicy denies (the node's IP by default).
    #[arg(long)]
    pub(crate) probe_host: String,
    /// The probe's port.
    #[arg(long)]
    pub(crate) probe_port: u16,
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
    let host: IpAddr = match args.probe_host.trim().parse() {
        Ok(ip) => ip,
        Err(_) => {
            eprintln!(
                "egress gate: --probe-host {:?} is not an IP address (the node's IP comes from the downward API)",
                args.probe_host
            );
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
    match crate::inpod::gate::wait_until_denied(host, args.probe_port, anchor, limit).await {
        Ok(took) => {
            eprintln!(
                "egress gate: {host}:{} denied after {} ms; the NetworkPolicy is in force, starting the workload",
                args.probe_port,
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
        argv.extend(gate.args(Some("proxy.sys.svc:3128")));
        let Ok(Command::EgressGate(args)) = Cli::try_parse_from(&argv).map(|c| c.command) else {
            panic!("{argv:?} does not parse as the gate");
        };
        assert_eq!(
            (args.probe_host.as_str(), args.probe_port),
            ("127.0.0.1", 9)
        );
        assert_eq!(args.anchor.as_deref(), Some("proxy.sys.svc:3128"));
        let bad = GateArgs {
            probe_host: "$(SANDBOXRUN_HOST_IP)".to_string(),
            probe_port: 9,
            timeout: "5s".to_string(),
            anchor: None,
        };
        assert_eq!(main(bad).await, ExitCode::from(2));
    }
}
