//! sandboxrun-operator: runs `SandboxRun`s as pods and drains their declared read-back paths into
//! object storage at teardown (ADR-143), behind the ADR-006 admission rules.
#![forbid(unsafe_code)]
// No function over 80 lines outside tests (the threshold is in clippy.toml; issue #26).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admission;
pub mod api;
pub mod caps;
pub mod cmd;
pub(crate) mod controller;
pub(crate) mod crdgen;
#[cfg(test)]
mod doc_drift;
pub mod doctor;
pub mod drain;
pub mod egress;
pub mod external_metrics;
pub mod files;
pub mod identity;
pub(crate) mod inpod;
pub mod kueue;
pub mod metrics;
#[cfg(test)]
mod module_map;
pub(crate) mod names;
pub mod plugin;
pub mod pod;
pub mod policy;
pub mod pool;
pub(crate) mod process;
pub mod registry;
pub(crate) mod restore;
pub(crate) mod selftest;
pub mod shard;
mod started;
pub mod store;
pub mod tar;
pub(crate) mod template;
#[cfg(test)]
pub(crate) mod testkit;
pub(crate) mod text;
pub mod units;
