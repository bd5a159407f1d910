//! The drain of one declared read-back path (ADR-143 §3): the holder's tar stream is parsed,
//! sanitized, metered against the path's cap, re-emitted (optionally compressed) and streamed into
//! object storage, then committed by a create-only manifest.
//!
//! - [`crate::tar::sanitize`]: pure verdict on one tar entry (unsafe paths, links, devices…).
//! - [`crate::caps`]: pure cap meter (a dropped member and the rest of the run).
//! - [`archive`]: the streaming pipeline and its upload into the store.

pub mod archive;
pub mod exec;
pub mod path_drain;

pub use archive::{
    drain_into_store, drain_stream, DrainError, DrainErrorKind, DrainOptions, Progress,
};
