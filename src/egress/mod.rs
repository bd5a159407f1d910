//! Enforcement of `spec.network` (docs/contract.md "ADR-006 network rules: validated and
//! enforced"): what the run asks for ([`mode`]), a per-run NetworkPolicy ([`policy`], judged by [`verdict`] and applied by the controller before
//! the pod exists)
//! for addresses, and the egress proxy ([`proxy`]) for host names, both judging with the one
//! matcher admission validates with ([`crate::egress::network`]). The workload reaches the
//! proxy through the variables of [`env`], authenticated by a per-run [`token`]. The proxy is
//! [`proxy`] (flags, accept loop, metrics endpoint), [`state`] (what connections share: bounds,
//! resolver, metrics), [`request`] (one connection, step by step), [`head`]
//! (request heads), [`runs`] (what it knows of runs and their pods), [`limits`] (connection
//! slots) and [`tunnel`] (the relay with its idle timeout); [`proxy_pods`] is what the operator
//! sees of the proxy's pods (their addresses, denied to a run while its gate waits).

pub mod env;
pub(crate) mod head;
pub(crate) mod limits;
#[cfg(test)]
mod loopback_tests;
pub(crate) mod mode;
pub(crate) mod network;
pub mod policy;
pub mod proxy;
pub(crate) mod proxy_pods;
pub(crate) mod request;
pub(crate) mod runs;
pub(crate) mod settings;
pub(crate) mod state;
pub mod token;
pub(crate) mod tunnel;
pub(crate) mod verdict;

pub use settings::{EgressSettings, PeerSelector, PolicyEnforcement, ProxyPeer};
