//! Admission: the ADR-006 rules as one pure engine ([`rules`]) with two front doors — the
//! validating webhook ([`webhook`]) and `doctor --strict` (`crate::doctor`) — which print the same
//! findings. [`ratchet`] decides what a review is judged by (CREATE in full; UPDATE ratcheted, so
//! that a run admitted once can always be let go of). The egress rule grammar is
//! `crate::egress::network`, [`policy`] the cluster's run policy, [`namespace_policy`] the
//! platform's named policies for the namespaces a label selector picks, [`resolvable`] what the
//! no-pull image check (`crate::registry`, the only I/O the rules know of) means as a finding,
//! [`certs`] the webhook's own certificates, [`schema`] the CRD's structural schema as `doctor`
//! judges unknown fields, [`serve`] the wiring for `run`, [`templates`] how a run made from a
//! SandboxRunTemplate is judged (its merged spec). [`published`] is the operator's live settings
//! as it publishes them ([`publish`]) and `doctor --context` reads them.

pub(crate) mod access;
pub mod certs;
pub(crate) mod client_auth;
pub(crate) mod mutate;
pub mod namespace_policy;
pub mod platform_pull;
pub mod policy;
pub(crate) mod publish;
pub(crate) mod published;
pub(crate) mod ratchet;
pub mod resolvable;
pub(crate) mod review_limit;
pub(crate) mod rules;
pub(crate) mod serve;
pub(crate) mod stamp;
pub(crate) mod stamp_key;
pub(crate) mod templates;
pub mod webhook;

pub use rules::{check, check_update, refusals, Finding, RuleSettings, Severity};
