//! The tar pieces the in-pod packer, the drain and `files get` share:
//!
//! - [`ustar`]: our ustar/PAX dialect, written by the packer and by the drain's re-emitter.
//! - [`sanitize`]: the pure verdict on one entry of an untrusted archive.
//! - [`notes`]: the packer's notes (unreadable, skipped, changed), carried in band by its archive.
//! - [`entry`]: one parsed entry's header fields, handed to the sanitizer (the drain and the
//!   extraction of `files get` read entries the same way).

pub(crate) mod entry;
pub(crate) mod notes;
pub mod sanitize;
pub(crate) mod ustar;
