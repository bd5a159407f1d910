//! What the binary does as the kubectl plugin `kubectl sandboxrun` beyond reading a store: talk to
//! the cluster as kubectl would ([`cluster`]: `--kubeconfig`, `--context`, the context's
//! namespace), find where a run's files were stored from its status ([`locate`]), print the
//! evidence of how a run ended ([`logs`]), and reach a live sandbox with the caller's rights
//! ([`session`]: `exec`, `shell`, `cp`).

pub mod cluster;
pub(crate) mod locate;
pub(crate) mod logs;
pub mod session;
