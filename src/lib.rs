//! sandboxrun-operator: runs `SandboxRun`s as pods and drains their declared read-back paths into
//! object storage at teardown (ADR-143), behind the ADR-006 admission rules.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod config;
pub mod drain;
pub mod pack;
pub mod store;
