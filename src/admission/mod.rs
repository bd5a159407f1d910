//! Admission: the webhook that serves the policy library (`crate::policy`, the ADR-006 rules as
//! one pure engine, also behind `doctor --strict`) — the validating webhook ([`webhook`]) and its
//! mutating half ([`mutate`]) that stamps a run whose author's rights it verified, the access
//! reviews' budget ([`review_limit`]), [`certs`] the webhook's own certificates, [`client_auth`]
//! who may call it, [`serve`] the wiring for `run`, and [`publish`] the writer of the operator's
//! published settings (`crate::policy::published`). It imports the library, never the other way
//! round.

pub mod certs;
pub(crate) mod client_auth;
pub(crate) mod mutate;
pub(crate) mod publish;
pub(crate) mod review_limit;
pub(crate) mod serve;
pub mod webhook;
