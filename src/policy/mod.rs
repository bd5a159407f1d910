//! The policy library: the ADR-006 rules as one pure engine ([`rules`]) that the webhook
//! (`crate::admission`), `doctor --strict` (`crate::doctor`), the controller, the pod builder and
//! the pools judge by, so that they print and refuse the same findings. [`ratchet`] decides what a
//! review is judged by (CREATE in full; UPDATE ratcheted, so that a run admitted once can always be
//! let go of). The egress rule grammar is `crate::egress::network`, [`run_policy`] the cluster's run
//! policy, [`namespace_policy`] the platform's named policies for the namespaces a label selector
//! picks, [`resolvable`] what the no-pull image check (`crate::registry`, the only I/O the rules
//! know of) means as a finding, [`platform_pull`] what the platform's pull Secrets may pull,
//! [`templates`] how a run made from a SandboxRunTemplate is judged (its merged spec), [`access`]
//! the rights a run exercises and their SubjectAccessReviews, [`stamp`] the HMAC the webhook puts
//! on a run whose author's rights it verified and the controller checks ([`stamp_key`] its key's
//! Secret). [`published`] is the operator's live settings as it publishes them
//! (`crate::admission::publish`) and `doctor --context` reads them. The library never uses the
//! webhook: `crate::admission` imports it, never the other way round.

pub(crate) mod access;
pub mod namespace_policy;
pub mod platform_pull;
pub(crate) mod published;
pub(crate) mod pull_secrets;
pub(crate) mod ratchet;
pub mod resolvable;
pub(crate) mod rules;
pub mod run_policy;
pub(crate) mod stamp;
pub(crate) mod stamp_key;
pub(crate) mod templates;

pub use rules::{check, check_update, refusals, Finding, RuleSettings, Severity};
