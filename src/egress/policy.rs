//! The per-run NetworkPolicy (docs/contract.md "ADR-006 network rules: validated and enforced").
//! Pure: a run and the operator's egress settings in, the object out.
//!
//! - `open`: no policy;
//! - `allowlist` with no rules (nothing may leave): every egress and ingress denied — but the
//!   egress proxy's port when the proxy anchors such a run's gate (it refuses the run's every
//!   request: [`crate::egress::EgressSettings::deny_all_anchor`]);
//! - otherwise: ingress denied; egress only to DNS, to the egress proxy (which judges host
//!   rules), and to the address ranges the IP/CIDR rules allow, computed with the same matcher
//!   admission validates with ([`crate::egress::network::allows`]), so the two cannot disagree;
//! - a `denylist` run's ranges are only those its rules allow explicitly (a `!` rule that is the
//!   last match): NetworkPolicies add up, so "every address but the denied ones" would let the
//!   run reach what its namespace's own policies deny. The wide form (the mode's default allow
//!   as ipBlocks) only with `run --egress-denylist-wide` ([`address_blocks`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::{NetworkMode, SandboxRun};
use crate::egress::mode::{egress_of, Egress, PolicyError};
use crate::egress::network::{allows, mask, Pattern, Rule};
use crate::egress::settings::{EgressSettings, PeerSelector, ProxyPeer};
use crate::names::{pod_name, RUN_UID_LABEL};

/// Suffix of a run's NetworkPolicy name, after its pod's name ([`policy_name`]).
pub(crate) const POLICY_SUFFIX: &str = "-egress";

/// Name of a run's NetworkPolicy: its pod's name plus [`POLICY_SUFFIX`] (pod names are at most
/// 253 characters; the suffix is dropped into the hash when it would not fit).
pub fn policy_name(run_name: &str) -> String {
    let pod = pod_name(run_name);
    if pod.len() + POLICY_SUFFIX.len() <= 253 {
        return format!("{pod}{POLICY_SUFFIX}");
    }
    let digest = crate::names::short_hash(&pod);
    let keep = 253 - POLICY_SUFFIX.len() - digest.len() - 1;
    let head = pod[..keep].trim_end_matches(['-', '.']);
    format!("{head}-{digest}{POLICY_SUFFIX}")
}

/// The NetworkPolicy of a run, or None when the run's egress is open.
pub(crate) fn build_policy(
    run: &SandboxRun,
    settings: &EgressSettings,
) -> Result<Option<NetworkPolicy>, PolicyError> {
    build(run, settings, &Denied::default())
}

/// What of the egress of the runs made from `made` shapes a pod (a part of its template hash,
/// `crate::pool::pod::template_hash`): their network rules as written (the egress proxy judges host
/// rules by them) and the NetworkPolicy they get under the operator's settings, but for whom it
/// selects. A run's own is the same value exactly when its pod's egress is the pool pod's.
pub fn egress_shape(made: &SandboxRun, settings: &EgressSettings) -> serde_json::Value {
    let policy = build_policy(made, settings).map(|p| {
        p.and_then(|p| p.spec).map(|mut spec| {
            spec.pod_selector = None;
            spec
        })
    });
    serde_json::json!({
        "network": made.spec.network,
        "policy": match policy {
            Ok(spec) => serde_json::to_value(spec).unwrap_or_default(),
            Err(e) => serde_json::Value::String(e.to_string()),
        },
    })
}

/// The NetworkPolicy of a run whose pod waits behind the egress gate (docs/contract.md "A
/// filtered run never has an unfiltered instant"): besides what its rules deny,
/// - the node at `node`, when the gate probes the node (`run --egress-gate-probe node:<port>`):
///   the gate can then see the policy in force for a denylist run too, and no restricted workload
///   reaches its node's kubelet;
/// - the egress proxy's pods at `proxy` ([`crate::egress::proxy_pods`]): the gate of a run
///   anchored on the proxy probes its canary, which a range the run allows could hold (the proxy
///   port stays open through the proxy's own rule).
///
/// None when the egress is not filtered (open, or nothing may leave: every address is denied
/// already), or when there is nothing to add.
pub(crate) fn policy_while_gated(
    run: &SandboxRun,
    settings: &EgressSettings,
    node: Option<IpAddr>,
    proxy: &[IpAddr],
) -> Result<Option<NetworkPolicy>, PolicyError> {
    let probes_node = settings
        .gate
        .is_some_and(|g| matches!(g.probe, crate::inpod::gate::GateProbe::Node(_)));
    let denied = Denied {
        node: node.filter(|_| probes_node),
        proxy,
    };
    if denied.is_empty() || !matches!(egress_of(run)?, Egress::Filtered { .. }) {
        return Ok(None);
    }
    build(run, settings, &denied)
}

/// What a gated run's policy denies besides its rules ([`policy_while_gated`]).
#[derive(Default)]
struct Denied<'a> {
    node: Option<IpAddr>,
    proxy: &'a [IpAddr],
}

impl Denied<'_> {
    fn is_empty(&self) -> bool {
        self.node.is_none() && self.proxy.is_empty()
    }

    fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.node.into_iter().chain(self.proxy.iter().copied())
    }
}

fn build(
    run: &SandboxRun,
    settings: &EgressSettings,
    denied: &Denied<'_>,
) -> Result<Option<NetworkPolicy>, PolicyError> {
    let name = run
        .metadata
        .name
        .clone()
        .ok_or(PolicyError::MissingMetadata("name"))?;
    let uid = run
        .metadata
        .uid
        .clone()
        .ok_or(PolicyError::MissingMetadata("uid"))?;
    let Some(egress_rules) = egress_rules(run, settings, denied)? else {
        return Ok(None);
    };
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            "sandboxrun-operator".to_string(),
        ),
        (RUN_UID_LABEL.to_string(), uid.clone()),
    ]);
    Ok(Some(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(policy_name(&name)),
            namespace: run.namespace(),
            labels: Some(labels),
            owner_references: run.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(RUN_UID_LABEL.to_string(), uid)])),
                match_expressions: None,
            }),
            // Both types listed and no ingress rule: nothing may connect to the pod (exec goes
            // through the apiserver and the kubelet, not the pod network).
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            ingress: Some(Vec::new()),
            egress: Some(egress_rules),
        }),
    }))
}

/// The policy's egress rules for `run`: DNS, the egress proxy and the address ranges its rules
/// allow, the gate's probe and `denied` denied; None when its egress is open (no policy).
fn egress_rules(
    run: &SandboxRun,
    settings: &EgressSettings,
    denied: &Denied<'_>,
) -> Result<Option<Vec<NetworkPolicyEgressRule>>, PolicyError> {
    Ok(Some(match egress_of(run)? {
        Egress::Open => return Ok(None),
        // The gate's anchor only: the proxy refuses every request of a run without rules.
        Egress::DenyAll => match (&settings.proxy, settings.deny_all_anchor()) {
            (Some(proxy), Some(_)) => vec![proxy_rule(proxy)],
            _ => Vec::new(),
        },
        Egress::Filtered { mode, mut rules } => {
            // The egress gate's fixed probe is denied to every restricted run, whatever its
            // rules, so the gate can see the policy in force (docs/contract.md "A filtered run
            // never has an unfiltered instant"). Last match wins.
            if let Some(probe) = fixed_gate_probe(settings) {
                rules.push(deny_rule(mode, probe));
            }
            rules.extend(denied.addresses().map(|a| deny_rule(mode, a)));
            let mut out = vec![dns_rule(&settings.dns)];
            out.extend(settings.proxy.as_ref().map(proxy_rule));
            let blocks = address_blocks(mode, &rules, settings.denylist_wide);
            if !blocks.is_empty() {
                out.push(NetworkPolicyEgressRule {
                    to: Some(
                        blocks
                            .into_iter()
                            .map(|b| NetworkPolicyPeer {
                                ip_block: Some(b),
                                ..NetworkPolicyPeer::default()
                            })
                            .collect(),
                    ),
                    ports: None,
                });
            }
            out
        }
    }))
}

/// The ipBlocks of a filtered run: what `allows(mode, rules, addr)` allows, except for a
/// `denylist` run without `wide`: only the addresses a `!` rule allows explicitly (the last
/// matching rule is a negated one), never the mode's default allow (docs/contract.md "ADR-006
/// network rules: validated and enforced"). Host names go through the proxy, which applies the
/// whole denylist.
pub(crate) fn address_blocks(mode: NetworkMode, rules: &[Rule], wide: bool) -> Vec<IPBlock> {
    if mode != NetworkMode::Denylist || wide {
        return ip_blocks(mode, rules);
    }
    // In a denylist a `!` match allows; in an allowlist a plain match does, and no match
    // denies. Flipping every rule's negation turns "allowed by an explicit rule" into the
    // allowlist verdict of the flipped rules.
    let flipped: Vec<Rule> = rules
        .iter()
        .map(|r| Rule {
            negated: !r.negated,
            ..r.clone()
        })
        .collect();
    ip_blocks(NetworkMode::Allowlist, &flipped)
}

/// The egress gate's probe address when it is a fixed one (`run --egress-gate-probe <ip>:<port>`).
fn fixed_gate_probe(settings: &EgressSettings) -> Option<IpAddr> {
    match settings.gate?.probe {
        crate::inpod::gate::GateProbe::Addr(addr) => Some(addr.ip()),
        crate::inpod::gate::GateProbe::Node(_) => None,
    }
}

/// The rule that denies `addr` in `mode`: an allowlist denies with `!`, a denylist with the bare
/// address.
fn deny_rule(mode: NetworkMode, addr: IpAddr) -> Rule {
    Rule {
        negated: mode != NetworkMode::Denylist,
        pattern: crate::egress::network::Pattern::Ip(addr),
        port: None,
    }
}

/// The proxy's pods at its port.
fn proxy_rule(proxy: &ProxyPeer) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![peer(&proxy.selector)]),
        ports: Some(vec![port("TCP", proxy.port)]),
    }
}

fn dns_rule(dns: &PeerSelector) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![peer(dns)]),
        ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
    }
}

fn peer(sel: &PeerSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                sel.namespace.clone(),
            )])),
            match_expressions: None,
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(sel.pod_labels.clone()),
            match_expressions: None,
        }),
        ip_block: None,
    }
}

fn port(protocol: &str, number: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.to_string()),
        port: Some(IntOrString::Int(i32::from(number))),
        end_port: None,
    }
}

/// An address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    network: IpAddr,
    prefix: u8,
}

impl Block {
    fn max_prefix(&self) -> u8 {
        if self.network.is_ipv4() {
            32
        } else {
            128
        }
    }

    fn contains(&self, other: &Block) -> bool {
        self.network.is_ipv4() == other.network.is_ipv4()
            && self.prefix <= other.prefix
            && mask(other.network, self.prefix) == self.network
    }

    fn halves(&self) -> [Block; 2] {
        let prefix = self.prefix + 1;
        let high = match self.network {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) | (1u32 << (32 - prefix)))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) | (1u128 << (128 - prefix)))),
        };
        [
            Block {
                network: self.network,
                prefix,
            },
            Block {
                network: high,
                prefix,
            },
        ]
    }

    fn cidr(&self) -> String {
        format!("{}/{}", self.network, self.prefix)
    }
}

/// The ranges the rules' address patterns carve out (`**` is every address of both families;
/// host-name patterns never match an address).
fn rule_blocks(rules: &[Rule]) -> Vec<Block> {
    rules
        .iter()
        .flat_map(|r| match &r.pattern {
            Pattern::Ip(a) => vec![Block {
                network: canonical(*a),
                prefix: if canonical(*a).is_ipv4() { 32 } else { 128 },
            }],
            Pattern::Cidr {
                network, prefix, ..
            } => vec![Block {
                network: *network,
                prefix: *prefix,
            }],
            Pattern::AnyHost => vec![v4_root(), v6_root()],
            _ => Vec::new(),
        })
        .collect()
}

fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    }
}

fn v4_root() -> Block {
    Block {
        network: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        prefix: 0,
    }
}

fn v6_root() -> Block {
    Block {
        network: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        prefix: 0,
    }
}

/// A representation of the allowed part of a block: ipBlocks whose union is exactly it.
#[derive(Clone, Debug, Default)]
struct Repr {
    blocks: Vec<IPBlock>,
}

impl Repr {
    /// Entries a reader has to look at: one per ipBlock and one per `except`.
    fn cost(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| 1 + b.except.as_ref().map_or(0, Vec::len))
            .sum()
    }
}

/// The ipBlocks allowing exactly the addresses `allows(mode, rules, addr)` allows: the address
/// space is split only where a rule's range begins inside a block, each uniform block is judged by
/// the matcher itself at its network address, and the shortest of "the block minus its denied
/// parts" and "its allowed parts, recursively" is kept.
pub(crate) fn ip_blocks(mode: NetworkMode, rules: &[Rule]) -> Vec<IPBlock> {
    let carved = rule_blocks(rules);
    let mut out = Vec::new();
    for root in [v4_root(), v6_root()] {
        out.extend(walk(root, mode, rules, &carved).0.blocks);
    }
    out
}

/// Whether every address of `block` gets the same verdict (no rule range starts strictly inside).
fn uniform(block: &Block, carved: &[Block]) -> bool {
    !carved
        .iter()
        .any(|r| r.prefix > block.prefix && block.contains(r))
}

fn verdict(block: &Block, mode: NetworkMode, rules: &[Rule]) -> bool {
    allows(mode, rules, &block.network.to_string())
}

/// The best representation of the allowed part of `block`, and its denied uniform parts.
fn walk(block: Block, mode: NetworkMode, rules: &[Rule], carved: &[Block]) -> (Repr, Vec<String>) {
    if uniform(&block, carved) || block.prefix >= block.max_prefix() {
        return if verdict(&block, mode, rules) {
            (
                Repr {
                    blocks: vec![IPBlock {
                        cidr: block.cidr(),
                        except: None,
                    }],
                },
                Vec::new(),
            )
        } else {
            (Repr::default(), vec![block.cidr()])
        };
    }
    let [low, high] = block.halves();
    let (mut split, mut denied) = walk(low, mode, rules, carved);
    let (high_repr, high_denied) = walk(high, mode, rules, carved);
    split.blocks.extend(high_repr.blocks);
    denied.extend(high_denied);
    // The block minus its denied parts, or its halves each as well as they can be: the shorter.
    let minus = Repr {
        blocks: vec![IPBlock {
            cidr: block.cidr(),
            except: Some(denied.clone()),
        }],
    };
    let best = if split.cost() <= minus.cost() {
        split
    } else {
        minus
    };
    (best, denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NetworkPolicy as NetSpec;
    use crate::egress::settings::ProxyPeer;

    fn rules(texts: &[&str]) -> Vec<Rule> {
        texts.iter().map(|t| Rule::parse(t).unwrap()).collect()
    }

    fn in_block(addr: IpAddr, b: &IPBlock) -> bool {
        let contains = |cidr: &str| {
            let (net, prefix) = cidr.split_once('/').unwrap();
            let net: IpAddr = net.parse().unwrap();
            let prefix: u8 = prefix.parse().unwrap();
            net.is_ipv4() == addr.is_ipv4() && mask(addr, prefix) == net
        };
        contains(&b.cidr) && !b.except.iter().flatten().any(|e| contains(e))
    }

    fn policy_allows(blocks: &[IPBlock], addr: IpAddr) -> bool {
        blocks.iter().any(|b| in_block(addr, b))
    }

    /// Addresses at and around every rule boundary, plus some well-known ones.
    fn samples(rules: &[Rule]) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = [
            "0.0.0.0",
            "1.1.1.1",
            "8.8.8.8",
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "169.254.169.253",
            "169.254.169.255",
            "192.168.1.1",
            "255.255.255.255",
            "::",
            "::1",
            "2001:db8::1",
            "fd00::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        for b in rule_blocks(rules) {
            let n = match b.network {
                IpAddr::V4(a) => u128::from(u32::from(a)),
                IpAddr::V6(a) => u128::from(a),
            };
            let size: u128 = if b.prefix == 0 {
                u128::MAX
            } else {
                (1u128 << (b.max_prefix() - b.prefix)) - 1
            };
            for v in [
                n.wrapping_sub(1),
                n,
                n.wrapping_add(1),
                n.wrapping_add(size / 2),
                n.wrapping_add(size),
                n.wrapping_add(size).wrapping_add(1),
            ] {
                out.push(if b.network.is_ipv4() {
                    IpAddr::V4(Ipv4Addr::from(v as u32))
                } else {
                    IpAddr::V6(Ipv6Addr::from(v))
                });
            }
        }
        out
    }

    fn agree(mode: NetworkMode, texts: &[&str]) -> Vec<IPBlock> {
        let rules = rules(texts);
        let blocks = ip_blocks(mode, &rules);
        for addr in samples(&rules) {
            assert_eq!(
                policy_allows(&blocks, addr),
                allows(mode, &rules, &addr.to_string()),
                "{mode:?} {texts:?} at {addr}: policy {blocks:?}"
            );
        }
        blocks
    }

    #[test]
    fn ip_blocks_agree_with_the_matcher() {
        for (mode, texts) in [
            (NetworkMode::Allowlist, vec!["10.0.0.0/8", "!10.1.0.0/16"]),
            (
                NetworkMode::Allowlist,
                vec!["10.0.0.0/8", "!10.1.0.0/16", "10.1.2.3"],
            ),
            (NetworkMode::Allowlist, vec!["**", "!169.254.169.254"]),
            (NetworkMode::Allowlist, vec!["!169.254.169.254", "**"]),
            (NetworkMode::Allowlist, vec!["**.example.com"]),
            (
                NetworkMode::Allowlist,
                vec!["2001:db8::/32", "!2001:db8:1::/48"],
            ),
            (NetworkMode::Allowlist, vec!["0.0.0.0/0", "!10.0.0.0/8"]),
            (
                NetworkMode::Denylist,
                vec!["169.254.169.254", "**.internal"],
            ),
            (NetworkMode::Denylist, vec!["10.0.0.0/8", "!10.0.0.0/24"]),
            (NetworkMode::Denylist, vec!["**", "!1.1.1.1"]),
            (NetworkMode::Denylist, vec![]),
        ] {
            agree(mode, &texts);
        }
    }

    /// Every ipBlock of `policy`'s egress rules.
    fn ip_blocks_of(policy: NetworkPolicy) -> Vec<IPBlock> {
        policy
            .spec
            .unwrap()
            .egress
            .unwrap()
            .into_iter()
            .flat_map(|rule| rule.to.unwrap_or_default())
            .filter_map(|p| p.ip_block)
            .collect()
    }

    #[test]
    fn a_fixed_gate_probe_is_denied_to_every_restricted_run_whatever_its_rules() {
        let probe: IpAddr = "10.9.9.9".parse().unwrap();
        // The wide denylist: a narrow one allows nothing by address in the first place.
        let settings = wide;
        let mut gated = settings();
        gated.gate = Some(crate::inpod::gate::GateSettings {
            probe: crate::inpod::gate::GateProbe::Addr(std::net::SocketAddr::new(probe, 9)),
            timeout: std::time::Duration::from_secs(60),
            anchor: true,
        });
        let blocks_of =
            |r: &SandboxRun, s: &EgressSettings| ip_blocks_of(build_policy(r, s).unwrap().unwrap());
        for (mode, rules) in [
            (NetworkMode::Allowlist, vec!["10.0.0.0/8".to_string()]),
            (NetworkMode::Denylist, vec!["192.168.0.0/16".to_string()]),
        ] {
            let r = run(Some(NetSpec { mode, rules }));
            // Without a fixed probe the run's rules alone allow it; with one it is carved out.
            assert!(
                policy_allows(&blocks_of(&r, &settings()), probe),
                "{mode:?}"
            );
            assert!(!policy_allows(&blocks_of(&r, &gated), probe), "{mode:?}");
            assert!(policy_allows(
                &blocks_of(&r, &gated),
                "10.9.9.8".parse().unwrap()
            ));
        }
    }

    #[test]
    fn a_node_probed_run_is_denied_its_nodes_address_once_scheduled_whatever_its_rules() {
        let node: IpAddr = "10.1.2.3".parse().unwrap();
        // The wide denylist: a narrow one allows nothing by address in the first place.
        let settings = wide;
        let gated = settings();
        assert!(matches!(
            gated.gate.map(|g| g.probe),
            Some(crate::inpod::gate::GateProbe::Node(10250))
        ));
        for (mode, rules) in [
            (NetworkMode::Allowlist, vec!["10.0.0.0/8".to_string()]),
            (NetworkMode::Denylist, vec!["192.168.0.0/16".to_string()]),
        ] {
            let r = run(Some(NetSpec { mode, rules }));
            // Before scheduling the run's rules alone allow the node; on it, it is carved out
            // and its neighbour is not.
            let before = build_policy(&r, &gated).unwrap().unwrap();
            assert!(policy_allows(&ip_blocks_of(before), node), "{mode:?}");
            let on_node = policy_while_gated(&r, &gated, Some(node), &[])
                .unwrap()
                .unwrap();
            let blocks = ip_blocks_of(on_node);
            assert!(!policy_allows(&blocks, node), "{mode:?}");
            assert!(policy_allows(&blocks, "10.1.2.4".parse().unwrap()));
        }
        let denylist = run(Some(NetSpec {
            mode: NetworkMode::Denylist,
            rules: vec![],
        }));
        // Nothing to add: the gate does not probe the node, egress is open, or nothing may leave.
        let mut off = settings();
        off.gate = None;
        assert!(policy_while_gated(&denylist, &off, Some(node), &[])
            .unwrap()
            .is_none());
        assert!(policy_while_gated(&run(None), &gated, Some(node), &[])
            .unwrap()
            .is_none());
        let deny_all = run(Some(NetSpec {
            mode: NetworkMode::Allowlist,
            rules: vec![],
        }));
        assert!(policy_while_gated(&deny_all, &gated, Some(node), &[])
            .unwrap()
            .is_none());
        assert!(policy_while_gated(&denylist, &gated, None, &[])
            .unwrap()
            .is_none());
    }

    /// Issue #38 item 4: a run that may reach nothing has its gate anchored on the proxy when
    /// the proxy serves a canary and its address is known: its policy allows that one peer, the
    /// proxy's port (no DNS, no range); otherwise nothing at all.
    #[test]
    fn a_run_that_may_reach_nothing_reaches_only_the_proxy_port_that_anchors_its_gate() {
        let deny_all = run(Some(NetSpec {
            mode: NetworkMode::Allowlist,
            rules: vec![],
        }));
        let egress_of = |s: &EgressSettings| {
            build_policy(&deny_all, s)
                .unwrap()
                .unwrap()
                .spec
                .and_then(|s| s.egress)
                .unwrap_or_default()
        };
        let mut anchored = settings();
        assert!(egress_of(&anchored).is_empty(), "no canary, no address");
        if let Some(proxy) = anchored.proxy.as_mut() {
            proxy.canary_port = Some(3129);
            proxy.address = "10.96.0.10".parse().ok();
        }
        let rules = egress_of(&anchored);
        assert_eq!(rules.len(), 1, "{rules:?}");
        let only = &rules[0];
        assert_eq!(
            only.ports.clone().unwrap_or_default(),
            vec![port("TCP", 3128)]
        );
        let peers = only.to.clone().unwrap_or_default();
        assert!(
            peers.len() == 1 && peers[0].ip_block.is_none() && peers[0].pod_selector.is_some(),
            "{peers:?}"
        );
        let mut unanchored = anchored.clone();
        if let Some(gate) = unanchored.gate.as_mut() {
            gate.anchor = false;
        }
        assert!(egress_of(&unanchored).is_empty(), "the gate has no anchor");
    }

    /// Issue #38 item 4: the gate of a run anchored on the proxy probes the proxy's canary,
    /// which a range the run allows may hold (a wide denylist always does). While it waits, the
    /// run's policy denies the proxy's pods in every range, whatever probe the gate uses; the
    /// proxy port stays open through the proxy's own rule, and the neighbours stay allowed.
    #[test]
    fn a_gated_runs_ranges_never_hold_the_proxys_pods() {
        let proxy: Vec<IpAddr> = ["10.244.0.7", "10.244.3.9"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let mut fixed = wide();
        fixed.gate = Some(crate::inpod::gate::GateSettings {
            probe: crate::inpod::gate::GateProbe::Addr("192.0.2.1:9".parse().unwrap()),
            timeout: std::time::Duration::from_secs(5),
            anchor: true,
        });
        for settings in [wide(), settings(), fixed] {
            for (mode, rules) in [
                (NetworkMode::Allowlist, vec!["example.com", "10.0.0.0/8"]),
                (NetworkMode::Denylist, vec!["192.168.0.0/16"]),
                (NetworkMode::Denylist, vec!["!10.244.0.0/16"]),
            ] {
                let rules = rules.into_iter().map(str::to_string).collect();
                let r = run(Some(NetSpec { mode, rules }));
                let before = ip_blocks_of(build_policy(&r, &settings).unwrap().unwrap());
                let Some(gated) = policy_while_gated(&r, &settings, None, &proxy).unwrap() else {
                    panic!("{mode:?}: the proxy's pods are something to add");
                };
                let blocks = ip_blocks_of(gated.clone());
                for addr in &proxy {
                    assert!(!policy_allows(&blocks, *addr), "{mode:?} {addr}");
                }
                let neighbour = "10.244.0.8".parse().unwrap();
                assert_eq!(
                    policy_allows(&blocks, neighbour),
                    policy_allows(&before, neighbour),
                    "{mode:?}: only the proxy's addresses are taken out"
                );
                let rules = gated.spec.and_then(|s| s.egress).unwrap_or_default();
                assert!(
                    rules.iter().any(|rule| rule
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.port == Some(IntOrString::Int(3128)))),
                    "{mode:?}: the proxy port stays open"
                );
            }
        }
    }

    #[test]
    fn ip_blocks_use_except_for_denied_sub_ranges() {
        let blocks = agree(NetworkMode::Allowlist, &["10.0.0.0/8", "!10.1.0.0/16"]);
        assert_eq!(
            blocks,
            vec![IPBlock {
                cidr: "10.0.0.0/8".into(),
                except: Some(vec!["10.1.0.0/16".into()]),
            }]
        );
        let blocks = agree(NetworkMode::Denylist, &["169.254.169.254"]);
        assert_eq!(
            blocks,
            vec![
                IPBlock {
                    cidr: "0.0.0.0/0".into(),
                    except: Some(vec!["169.254.169.254/32".into()]),
                },
                IPBlock {
                    cidr: "::/0".into(),
                    except: None,
                },
            ]
        );
        // Host-name rules only: nothing by address in an allowlist (the proxy judges names).
        assert!(agree(NetworkMode::Allowlist, &["**.example.com"]).is_empty());
    }

    fn settings() -> EgressSettings {
        EgressSettings {
            proxy: Some(ProxyPeer {
                url: "http://proxy.sys.svc:3128".into(),
                selector: PeerSelector {
                    namespace: "sys".into(),
                    pod_labels: BTreeMap::from([("app".into(), "proxy".into())]),
                },
                port: 3128,
                canary_port: None,
                address: None,
            }),
            ..EgressSettings::default()
        }
    }

    /// [`settings`] with `--egress-denylist-wide`.
    fn wide() -> EgressSettings {
        EgressSettings {
            denylist_wide: true,
            ..settings()
        }
    }

    fn denylist(rules: &[&str]) -> SandboxRun {
        run(Some(NetSpec {
            mode: NetworkMode::Denylist,
            rules: rules.iter().map(|r| r.to_string()).collect(),
        }))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_denylist_run_allows_by_address_only_what_its_rules_allow_explicitly() {
        // Issue #38: in a namespace whose own policies deny all egress, a denylist run of
        // 203.0.113.0/24 must not reach more than an open run (NetworkPolicies add up).
        let p = build_policy(&denylist(&["203.0.113.0/24", "**.internal"]), &settings())
            .unwrap()
            .unwrap();
        let egress = p.spec.clone().unwrap().egress.unwrap();
        assert_eq!(egress.len(), 2, "DNS and the proxy only: {egress:?}");
        let blocks = ip_blocks_of(p);
        assert!(blocks.is_empty(), "no address range: {blocks:?}");
        // A `!` rule allows its range explicitly, and a later plain rule carves it again.
        let r = denylist(&["10.0.0.0/8", "!10.1.0.0/16", "10.1.2.0/24"]);
        let blocks = ip_blocks_of(build_policy(&r, &settings()).unwrap().unwrap());
        assert!(policy_allows(&blocks, ip("10.1.0.1")), "{blocks:?}");
        for denied in [
            "10.1.2.3",
            "10.2.0.1",
            "8.8.8.8",
            "192.168.1.1",
            "2001:db8::1",
        ] {
            assert!(!policy_allows(&blocks, ip(denied)), "{denied}: {blocks:?}");
        }
    }

    #[test]
    fn a_denylist_policy_allows_exactly_the_addresses_a_negated_rule_decides() {
        for texts in [
            vec!["203.0.113.0/24"],
            vec![],
            vec!["10.0.0.0/8", "!10.0.0.0/24"],
            vec!["**", "!1.1.1.1"],
            vec!["!**", "169.254.169.254"],
            vec!["!2001:db8::/32", "2001:db8:1::/48", "**.internal"],
        ] {
            let rules = rules(&texts);
            let blocks = address_blocks(NetworkMode::Denylist, &rules, false);
            for addr in samples(&rules) {
                let (allowed, by) = crate::egress::network::decide(
                    NetworkMode::Denylist,
                    &rules,
                    &addr.to_string(),
                    None,
                );
                assert_eq!(
                    policy_allows(&blocks, addr),
                    allowed && by.is_some(),
                    "{texts:?} at {addr}: {blocks:?}"
                );
            }
        }
    }

    #[test]
    fn the_wide_denylist_policy_is_only_for_a_platform_that_allows_it() {
        assert!(!EgressSettings::default().denylist_wide, "off by default");
        let r = denylist(&["203.0.113.0/24"]);
        let narrow = ip_blocks_of(build_policy(&r, &settings()).unwrap().unwrap());
        assert!(!policy_allows(&narrow, ip("8.8.8.8")), "{narrow:?}");
        let wide_blocks = ip_blocks_of(build_policy(&r, &wide()).unwrap().unwrap());
        assert!(
            policy_allows(&wide_blocks, ip("8.8.8.8")),
            "{wide_blocks:?}"
        );
        assert!(
            !policy_allows(&wide_blocks, ip("203.0.113.7")),
            "{wide_blocks:?}"
        );
        // The flag changes nothing for an allowlist.
        let allow = run(Some(NetSpec {
            mode: NetworkMode::Allowlist,
            rules: vec!["10.0.0.0/8".into()],
        }));
        assert_eq!(
            build_policy(&allow, &settings()),
            build_policy(&allow, &wide())
        );
    }

    fn run(network: Option<NetSpec>) -> SandboxRun {
        crate::testkit::sandbox_run("r1")
            .namespace("ns")
            .uid("uid-1")
            .edit(|spec| spec.network = network)
            .build()
    }

    #[test]
    fn open_mode_and_no_network_have_no_policy() {
        assert_eq!(build_policy(&run(None), &settings()), Ok(None));
        let open = NetSpec {
            mode: NetworkMode::Open,
            rules: vec!["**".into()],
        };
        assert_eq!(build_policy(&run(Some(open)), &settings()), Ok(None));
    }

    #[test]
    fn an_empty_allowlist_denies_all_egress_and_ingress() {
        let p = build_policy(
            &run(Some(NetSpec {
                mode: NetworkMode::Allowlist,
                rules: vec![],
            })),
            &settings(),
        )
        .unwrap()
        .unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.egress, Some(vec![]));
        assert_eq!(spec.ingress, Some(vec![]));
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
    }

    #[test]
    fn a_policy_with_rules_allows_dns_the_proxy_and_the_allowed_ranges_only() {
        let p = build_policy(
            &run(Some(NetSpec {
                mode: NetworkMode::Denylist,
                rules: vec!["169.254.169.254".into(), "**.internal".into()],
            })),
            &wide(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("r1-sbr-egress"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("uid-1", Some(true))
        );
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap(),
            BTreeMap::from([(RUN_UID_LABEL.to_string(), "uid-1".to_string())])
        );
        assert_eq!(spec.ingress, Some(vec![]));
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 3);
        let dns = &egress[0];
        assert_eq!(
            dns.to.as_ref().unwrap()[0]
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels,
            Some(BTreeMap::from([("k8s-app".into(), "kube-dns".into())]))
        );
        assert_eq!(dns.ports.as_ref().unwrap().len(), 2);
        let proxy = &egress[1];
        assert_eq!(
            proxy.ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(3128))
        );
        let blocks = &egress[2].to.as_ref().unwrap();
        assert_eq!(
            blocks[0].ip_block,
            Some(IPBlock {
                cidr: "0.0.0.0/0".into(),
                except: Some(vec!["169.254.169.254/32".into()]),
            })
        );
    }

    #[test]
    fn a_bad_rule_is_named() {
        let e = build_policy(
            &run(Some(NetSpec {
                mode: NetworkMode::Allowlist,
                rules: vec!["ok.com".into(), "bad host".into()],
            })),
            &settings(),
        )
        .unwrap_err();
        assert!(matches!(e, PolicyError::BadRule { index: 1, .. }), "{e}");
    }

    #[test]
    fn policy_names_fit_a_dns_subdomain() {
        assert_eq!(policy_name("r"), "r-sbr-egress");
        let long = "a".repeat(260);
        assert!(policy_name(&long).len() <= 253);
        assert!(policy_name(&long).ends_with(POLICY_SUFFIX));
    }
}
