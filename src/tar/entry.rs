//! One entry of an untrusted archive, read for the sanitizer: the header fields it judges, read
//! once and owned, so the entry's content can be read afterwards. The drain (the pod's stream) and
//! `files get` (a stored archive, untrusted too) read their entries through this, so both judge
//! the same fields the same way.

use std::io;

use tokio::io::AsyncRead;

use super::sanitize::{Decision, EntryInfo, EntryKind, Sanitizer};

/// The fields of one parsed entry the sanitizer judges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawEntry {
    /// The tar type flag.
    pub(crate) type_byte: u8,
    /// What the type flag says (the caller may refine it, e.g. a sparse file).
    pub(crate) kind: EntryKind,
    /// Content bytes (a PAX `size` record overrides the ustar field).
    pub(crate) size: u64,
    /// The raw path (PAX `path` or GNU long name included).
    pub(crate) path: Vec<u8>,
    /// The raw link target, if any.
    pub(crate) link: Option<Vec<u8>>,
}

impl RawEntry {
    /// Reads the fields of `entry`; an error means the entry is malformed.
    pub(crate) fn read<R: AsyncRead + Unpin>(entry: &tokio_tar::Entry<R>) -> io::Result<Self> {
        let type_byte = entry.header().entry_type().as_byte();
        Ok(RawEntry {
            type_byte,
            kind: EntryKind::from_type_byte(type_byte),
            size: entry.effective_size(),
            path: entry.path_bytes()?.into_owned(),
            link: entry.link_name_bytes()?.map(|l| l.into_owned()),
        })
    }

    /// What the sanitizer is shown.
    pub(crate) fn info(&self) -> EntryInfo<'_> {
        EntryInfo {
            path: &self.path,
            kind: self.kind,
            link_target: self.link.as_deref(),
            size: self.size,
        }
    }

    /// The sanitizer's verdict on this entry (the sanitizer counts it).
    pub(crate) fn judge(&self, sanitizer: &mut Sanitizer) -> Decision {
        sanitizer.check(&self.info())
    }
}
