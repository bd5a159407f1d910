//! The drain of one declared read-back path (ADR-143 §3): the holder's tar stream is parsed,
//! sanitized, metered against the path's cap, re-emitted (optionally compressed) and streamed into
//! object storage, then committed by a create-only manifest.
//!
//! - [`path_drain`]: one path end to end — exec, pipeline, commit, retries — to a status entry;
//!   [`attempt_error`]: why an attempt failed and what that means (retry, metric, words);
//!   [`outcome`]: the status entry it ends with (pure).
//! - [`exec`]: the `pack` exec in the holder and its exit status.
//! - [`wire`]: the packer's stream as it crosses the exec (tar, tar in zstd, or the adaptive
//!   wire of [`wire_blocks`]: blocks compressed or stored, whichever is smaller), decoded before
//!   the pipeline.
//! - [`pod_notes`]: what the manifest keeps of the packer's notes (in band, or an older packer's
//!   stderr), and the changed members they name.
//! - [`idle`]: the per-path idle bound on the exec's stdout (a trickling packer is cut off).
//! - [`bandwidth`]: the replica's drain bandwidth, one token bucket shared by its drains
//!   (`run --max-drain-bytes-per-second`).
//! - [`archive`]: the streaming drain ([`archive::drain_stream`]) and its upload into the store;
//!   [`pipeline`]: one drain in progress, entry by entry; [`tar_headers`]: what it reads of an
//!   entry's headers besides the parser's answer.
//!
//! What the pipeline shares with others lives elsewhere: the entry verdict in
//! [`crate::tar::sanitize`], the ustar writer in [`crate::tar::ustar`], the cap meter in
//! [`crate::caps`], the manifest records in [`crate::store::manifest`].

pub(crate) mod archive;
#[cfg(test)]
mod archive_tests;
mod attempt_error;
pub(crate) mod bandwidth;
pub mod exec;
mod fence;
pub(crate) mod idle;
mod options;
mod outcome;
pub(crate) mod path_drain;
mod pipeline;
pub(crate) mod pod_notes;
mod stream_io;
mod tar_headers;
pub(crate) mod wire;
mod wire_blocks;

pub use archive::{
    drain_into_store, drain_stream, DrainError, DrainErrorKind, DrainOptions, Progress,
};
pub use fence::Fence;
