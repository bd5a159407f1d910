//! The drains: a run's teardown ([`teardown`]) and a running sandbox's checkpoint
//! ([`checkpoint`]), each a loop of its own (observe → decide → act, documented in its file's
//! head) run in the drain pool ([`pool`]: the slots, fair between namespaces through
//! [`queue`]), off the reconcile workers; the pipeline starts them and act carries out their
//! drains (docs/architecture.md "The controllers beside the pipeline").

pub(crate) mod checkpoint;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod teardown;

#[cfg(test)]
mod checkpoint_scenarios;
#[cfg(test)]
mod teardown_scenarios;
