//! What a run's `spec.network` asks for, parsed once with admission's rule grammar
//! ([`crate::egress::network`]): the decision the policy, the proxy variables and the proxy
//! itself all start from (docs/contract.md "ADR-006 network rules: validated and enforced").

use thiserror::Error;

use crate::api::{NetworkMode, SandboxRun};
use crate::egress::network::{Rule, RuleError};

/// Why no policy can be built for a run.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum PolicyError {
    /// The run has no name or uid (a run read from the API always has both).
    #[error("the run has no {0}")]
    MissingMetadata(&'static str),
    /// A rule does not parse (admission refuses it; a run admitted before the webhook existed
    /// may still carry one).
    #[error("spec.network.rules[{index}] {rule:?}: {source}")]
    BadRule {
        /// Index of the rule.
        index: usize,
        /// The rule as written.
        rule: String,
        /// Why it does not parse.
        #[source]
        source: RuleError,
    },
}

/// What a run's egress is, once parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Egress {
    /// No `spec.network`, or mode `open`: nothing is filtered, no policy.
    Open,
    /// `allowlist` without rules: nothing leaves the pod (no DNS; the proxy's port only when it
    /// anchors the run's egress gate, and it refuses the run's every request).
    DenyAll,
    /// Rules to enforce: a policy (addresses) plus the proxy (host names).
    Filtered {
        /// The mode.
        mode: NetworkMode,
        /// The parsed rules, in order.
        rules: Vec<Rule>,
    },
}

impl Egress {
    /// Whether the run asks for any egress restriction.
    pub(crate) fn is_restricted(&self) -> bool {
        !matches!(self, Egress::Open)
    }
}

/// Parses a run's `spec.network`.
pub(crate) fn egress_of(run: &SandboxRun) -> Result<Egress, PolicyError> {
    egress_of_network(run.spec.network.as_ref())
}

/// Parses a `spec.network` (as a run has it, or as its pod recorded it: `crate::started`).
pub(crate) fn egress_of_network(
    net: Option<&crate::api::NetworkPolicy>,
) -> Result<Egress, PolicyError> {
    let Some(net) = net else {
        return Ok(Egress::Open);
    };
    if net.mode == NetworkMode::Open {
        return Ok(Egress::Open);
    }
    let rules = parse_rules(&net.rules)?;
    if net.mode == NetworkMode::Allowlist && rules.is_empty() {
        return Ok(Egress::DenyAll);
    }
    Ok(Egress::Filtered {
        mode: net.mode,
        rules,
    })
}

/// Parses rules as admission does, naming the first that does not parse.
pub(crate) fn parse_rules(texts: &[String]) -> Result<Vec<Rule>, PolicyError> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            Rule::parse(text).map_err(|source| PolicyError::BadRule {
                index,
                rule: text.clone(),
                source,
            })
        })
        .collect()
}
