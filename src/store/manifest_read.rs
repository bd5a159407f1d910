//! What reading a manifest may cost (docs/contract.md "Drain memory", issue #51 item 7). A tenant
//! holds its own store's credentials and can put any JSON at a manifest key; the manifest is read
//! before every drain attempt (is the path committed?) and by a reconcile whose pod is gone. Its
//! bytes were bounded (`MAX_MANIFEST_BYTES` of the manifest module, 80 MiB), not what they parse to:
//! 80 MiB of one-field members parsed to ~340 MiB, in every drain slot and reconcile worker at
//! once. So a manifest is parsed as it streams in — its bytes are never held whole — and the
//! parse refuses, as it goes:
//! - a JSON string longer than [`MAX_JSON_STRING_BYTES`] (the longest the operator writes is a
//!   64 KiB link target, escaped), before it is buffered;
//! - members costing more than the largest metadata allowance, as the drain's meter charges
//!   them (512 bytes + path + link target each: at most 65,536 members);
//! - dropped or rejected records costing more than the listed-record bound (64 bytes + path
//!   each), changed records and packer notes past [`MAX_NOTE_BYTES`].
//!
//! Those are what a drain can write at most, so every manifest the operator wrote still reads,
//! and what a forged one can make the operator hold is what its own worst one does.

use std::io::Read;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::caps::MAX_METADATA_ALLOWANCE;

/// Longest JSON string (in its escaped form) a manifest may hold: a 64 KiB link target or
/// note, each byte escaped as `\u00XX` at worst.
pub(crate) const MAX_JSON_STRING_BYTES: u64 = 6 * 64 * 1024 + 1024;
/// The drain's listed-record bound (`crate::drain::options::MAX_LISTED_RECORD_BYTES`; the drain
/// checks that the two agree), charged here to each of `dropped` and `rejected`.
pub(crate) const LISTED_RECORD_BYTES: u64 = 8 * 1024 * 1024;
/// What one listed record costs besides its path (`crate::drain::options::RECORD_OVERHEAD_BYTES`).
pub(crate) const RECORD_OVERHEAD: u64 = 64;
/// Bytes of `changed` records and of `podNotes` a manifest may list (the packer's notes are at
/// most 64 KiB of stderr or ~48 KiB in band).
pub(crate) const MAX_NOTE_BYTES: u64 = 1024 * 1024;
/// A SHA-256 in hex: what a member's hash may take without being charged.
pub(crate) const SHA256_HEX: u64 = 64;

/// Why a read stopped (carried in an `io::Error` through the JSON parser).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadBound {
    /// More bytes than the manifest bound.
    #[error("more than {0} bytes")]
    TooLarge(u64),
    /// A string longer than [`MAX_JSON_STRING_BYTES`].
    #[error("a JSON string longer than {MAX_JSON_STRING_BYTES} bytes")]
    LongString,
}

/// A reader of a manifest's JSON that fails past `max` bytes and at a string longer than
/// [`MAX_JSON_STRING_BYTES`] — before the parser has buffered it.
pub(crate) struct Bounded<R> {
    inner: R,
    max: u64,
    read: u64,
    in_string: bool,
    escaped: bool,
    string_bytes: u64,
}

impl<R> Bounded<R> {
    /// `inner`, at most `max` bytes of it.
    pub(crate) fn new(inner: R, max: u64) -> Self {
        Bounded {
            inner,
            max,
            read: 0,
            in_string: false,
            escaped: false,
            string_bytes: 0,
        }
    }

    /// Follows the JSON lexer through `bytes`: whether a string grew past its bound.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if !self.in_string {
                if b == b'"' {
                    (self.in_string, self.string_bytes) = (true, 0);
                }
                continue;
            }
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => {
                    self.in_string = false;
                    continue;
                }
                _ => {}
            }
            self.string_bytes += 1;
            if self.string_bytes > MAX_JSON_STRING_BYTES {
                return true;
            }
        }
        false
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read = self.read.saturating_add(n as u64);
        if self.read > self.max {
            return Err(std::io::Error::other(ReadBound::TooLarge(self.max)));
        }
        if self.scan(&buf[..n]) {
            return Err(std::io::Error::other(ReadBound::LongString));
        }
        Ok(n)
    }
}

/// What one listed record costs against its list's budget.
pub(crate) trait Costed {
    /// Its cost.
    fn cost(&self) -> u64;
}

/// A listed record's charge: the overhead, its path, and an `extra` string past `free` bytes.
pub(crate) fn record_cost(path: &str, extra: &str, free: u64) -> u64 {
    RECORD_OVERHEAD
        .saturating_add(path.len() as u64)
        .saturating_add((extra.len() as u64).saturating_sub(free))
}

impl Costed for String {
    fn cost(&self) -> u64 {
        RECORD_OVERHEAD.saturating_add(self.len() as u64)
    }
}

/// A list deserialized within `budget`: the first element that takes it past is refused.
struct WithinBudget<T> {
    budget: u64,
    what: &'static str,
    _items: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de> + Costed> Visitor<'de> for WithinBudget<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a list of {}", self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        let mut spent = 0u64;
        while let Some(item) = seq.next_element::<T>()? {
            spent = spent.saturating_add(item.cost());
            if spent > self.budget {
                return Err(serde::de::Error::custom(format_args!(
                    "the manifest's {} cost more than the {} bytes a drain can list",
                    self.what, self.budget
                )));
            }
            out.push(item);
        }
        Ok(out)
    }
}

fn within<'de, D: Deserializer<'de>, T: Deserialize<'de> + Costed>(
    d: D,
    budget: u64,
    what: &'static str,
) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(WithinBudget {
        budget,
        what,
        _items: std::marker::PhantomData,
    })
}

/// A list within the largest metadata allowance (`members`).
pub(crate) fn within_metadata<'de, D: Deserializer<'de>, T: Deserialize<'de> + Costed>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    within(d, MAX_METADATA_ALLOWANCE, "members")
}

/// A list within the listed-record bound (`dropped`, `rejected`).
pub(crate) fn within_listed<'de, D: Deserializer<'de>, T: Deserialize<'de> + Costed>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    within(d, LISTED_RECORD_BYTES, "dropped or rejected records")
}

/// A list within [`MAX_NOTE_BYTES`] (`changed`, `podNotes`).
pub(crate) fn within_notes<'de, D: Deserializer<'de>, T: Deserialize<'de> + Costed>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    within(d, MAX_NOTE_BYTES, "changed records or packer notes")
}
