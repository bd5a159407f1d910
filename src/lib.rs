//! sandboxrun-operator: runs `SandboxRun`s as pods and drains their declared read-back paths into
//! object storage at teardown (ADR-143), behind the ADR-006 admission rules.
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod cli;
pub mod config;
pub mod controller;
pub mod crdgen;
pub mod drain;
pub mod files;
pub mod holder;
pub mod metrics;
pub mod operator;
pub mod pack;
pub mod pod;
pub mod store;
pub mod store_credentials;
pub mod upload_guard;
pub mod util;
