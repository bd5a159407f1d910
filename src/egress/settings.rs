//! Operator-wide egress settings (`run --network-policy`, `--egress-*`, `--dns-*`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use clap::ValueEnum;
use thiserror::Error;

/// What the cluster admin declares about NetworkPolicy enforcement (`run --network-policy`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyEnforcement {
    /// The CNI enforces NetworkPolicy: runs start with their policy.
    #[default]
    Enforced,
    /// Policies are not enforced here: a run that asks for egress restrictions does not start.
    UnenforcedRefuse,
    /// Policies are not enforced here: such a run starts with a Warning Event.
    UnenforcedWarn,
}

impl fmt::Display for PolicyEnforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyEnforcement::Enforced => "enforced",
            PolicyEnforcement::UnenforcedRefuse => "unenforced-refuse",
            PolicyEnforcement::UnenforcedWarn => "unenforced-warn",
        })
    }
}

/// Pods in one namespace with some labels (a NetworkPolicy peer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSelector {
    /// The namespace's name (matched by its `kubernetes.io/metadata.name` label).
    pub namespace: String,
    /// Labels the pods carry.
    pub pod_labels: BTreeMap<String, String>,
}

/// The egress proxy as the run pods see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyPeer {
    /// Its URL without credentials, e.g. `http://sandboxrun-egress-proxy.sandboxrun-system.svc:3128`.
    pub url: String,
    /// Its pods.
    pub selector: PeerSelector,
    /// The port its pods listen on (what the NetworkPolicy opens).
    pub port: u16,
    /// Its canary port (`egress-proxy --canary-listen`): served by the same pods, never opened
    /// by a run's policy; the egress gate's probe for runs it anchors (`crate::inpod::gate`).
    pub canary_port: Option<u16>,
    /// Its address, resolved from the URL's host when the operator starts (its Service's cluster
    /// IP): the anchor of the gate of a run that may reach nothing, which has no DNS
    /// ([`EgressSettings::deny_all_anchor`]). None: such runs have no anchor.
    pub address: Option<std::net::IpAddr>,
}

/// Egress settings of the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressSettings {
    /// Whether NetworkPolicy is enforced in this cluster.
    pub enforcement: PolicyEnforcement,
    /// The cluster DNS pods every filtered run may query.
    pub dns: PeerSelector,
    /// The egress proxy; None: host-name rules are not enforced (said in the Event).
    pub proxy: Option<ProxyPeer>,
    /// Secret the per-run proxy tokens are derived from (None: no proxy env in the pod).
    pub token_secret: Option<TokenSecret>,
    /// What the workload reaches without the proxy (`NO_PROXY`).
    pub no_proxy: String,
    /// The egress gate of filtered runs' pods (`run --egress-gate-probe`; None: off).
    pub gate: Option<crate::inpod::gate::GateSettings>,
    /// `run --egress-denylist-wide`: a denylist run's NetworkPolicy allows every address but
    /// the denied ones. Off (the default): it allows only DNS, the proxy and the ranges its `!`
    /// rules allow explicitly, so it never reaches more than the namespace's own policies allow
    /// (docs/contract.md "ADR-006 network rules: validated and enforced").
    pub denylist_wide: bool,
}

impl EgressSettings {
    /// The anchor of the egress gate of a run that may reach nothing (`allowlist` without rules),
    /// by address (its policy allows no DNS): the proxy at its resolved address, when the gate
    /// anchors and the proxy serves a canary. Such a run's policy then allows that one peer, the
    /// proxy's port (`crate::egress::policy`), which refuses its every request (no rule allows
    /// anything); the gate probes the canary beside it (docs/contract.md "A filtered run never has
    /// an unfiltered instant"). None: no anchor, the plain probe.
    pub(crate) fn deny_all_anchor(&self) -> Option<std::net::SocketAddr> {
        let gate = self.gate.as_ref()?;
        let proxy = self.proxy.as_ref()?;
        proxy.canary_port?;
        gate.anchor
            .then(|| {
                proxy
                    .address
                    .map(|ip| std::net::SocketAddr::new(ip, proxy.port))
            })
            .flatten()
    }
}

/// The proxy token secret; its Debug never shows it (settings are logged).
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(pub Arc<[u8]>);

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(<redacted>)")
    }
}

/// Default `NO_PROXY`: loopback and cluster-local names (docs/contract.md "ADR-006 network rules").
pub(crate) const DEFAULT_NO_PROXY: &str = "localhost,127.0.0.1,::1,.svc,.cluster.local";

impl Default for EgressSettings {
    fn default() -> Self {
        EgressSettings {
            enforcement: PolicyEnforcement::Enforced,
            dns: PeerSelector {
                namespace: "kube-system".to_string(),
                pod_labels: BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]),
            },
            proxy: None,
            token_secret: None,
            no_proxy: DEFAULT_NO_PROXY.to_string(),
            gate: Some(crate::inpod::gate::GateSettings {
                probe: crate::inpod::gate::GateProbe::Node(10250),
                timeout: std::time::Duration::from_secs(60),
                anchor: true,
            }),
            denylist_wide: false,
        }
    }
}

/// A selector flag that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{flag}: {why} (want key=value[,key=value…])")]
pub(crate) struct SelectorError {
    /// The flag.
    pub flag: &'static str,
    /// What is wrong.
    pub why: String,
}

/// Parses `key=value,key=value` labels.
pub(crate) fn parse_labels(
    flag: &'static str,
    items: &[String],
) -> Result<BTreeMap<String, String>, SelectorError> {
    let mut out = BTreeMap::new();
    for item in items.iter().filter(|i| !i.trim().is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| SelectorError {
            flag,
            why: format!("{item:?} has no `=`"),
        })?;
        if k.trim().is_empty() {
            return Err(SelectorError {
                flag,
                why: format!("{item:?} has an empty key"),
            });
        }
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    if out.is_empty() {
        return Err(SelectorError {
            flag,
            why: "no label given".to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_empty_is_refused() {
        assert_eq!(
            parse_labels("--x", &["a=b".into(), "c = d".into()]),
            Ok(BTreeMap::from([
                ("a".into(), "b".into()),
                ("c".into(), "d".into())
            ]))
        );
        assert!(parse_labels("--x", &["ab".into()]).is_err());
        assert!(parse_labels("--x", &[]).is_err());
        let secret = TokenSecret(Arc::from(b"hunter2hunter2hunter2".as_slice()));
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert_eq!(
            PolicyEnforcement::UnenforcedRefuse.to_string(),
            "unenforced-refuse"
        );
    }
}
