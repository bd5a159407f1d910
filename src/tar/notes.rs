//! The packer's notes, in band (docs/contract.md, "The packer's notes travel in-band"): what the
//! packer did not pack as-is — unreadable entries, skipped special files, files that changed while
//! read — travel as PAX records on one marker entry at the end of its archive, not only on stderr,
//! where 64 KiB of FIFO names could push an unreadable file's note out and turn a failure into an
//! empty set.
//!
//! The marker is a directory entry for the archive root itself (`./`): the sanitizer ignores it
//! (`crate::tar::sanitize::Decision::Ignore`), so no operator ever stores it as a member — an
//! operator that predates the notes ignores it silently — and the packer never writes `./` for a
//! workload's entry (the walk starts below the root). Its records:
//!
//! - `SANDBOXRUN.notes=1`: the marker (and version) of the notes;
//! - `SANDBOXRUN.notes.unreadable|skipped|changed=<count>`: how many of each, listed or not;
//! - one record per listed entry, NUL-separated fields, each percent-escaped
//!   ([`escape`]: control bytes and `%`), so no field holds a NUL or a newline:
//!   `SANDBOXRUN.unreadable=<path>\0<error>`, `SANDBOXRUN.skipped=<kind>\0<path>`,
//!   `SANDBOXRUN.changed=<reason>\0<stat size>\0<bytes read>\0<path>`. The drain's parser
//!   (`astral-tokio-tar`) honours the length prefix, but the `tar` crate's splits PAX records on
//!   newlines: escaped, a file name with a newline can break no record and smuggle none in,
//!   whichever parser reads the notes.
//!
//! Bounded both ways: each kind lists at most [`MAX_LISTED_BYTES_PER_KIND`] bytes of entries (a
//! flood of FIFOs cannot push an unreadable file out: each kind has its own room), past which
//! entries are only counted — well under the drain's bound on one PAX body. The reader holds to
//! the same bounds, never lets a declared count be lower than what it listed, and adds up the
//! notes of a stream that (wrongly) carries several markers, so no record lowers another.
//! Pure: encoding and decoding only.

use super::ustar;

/// The marker record: its presence makes a root entry the packer's notes.
pub(crate) const NOTES_KEY: &[u8] = b"SANDBOXRUN.notes";
/// The notes' version, the value of [`NOTES_KEY`].
pub(crate) const NOTES_VERSION: &[u8] = b"1";
/// Path of the marker entry: the archive root.
pub(crate) const MARKER_PATH: &[u8] = b"./";
/// Most bytes of listed entries (paths, errors, fields) per kind; past it, entries are counted.
pub(crate) const MAX_LISTED_BYTES_PER_KIND: usize = 16 * 1024;
/// Longest path listed (the longest the operator stores); a longer one is cut and says so.
pub(crate) const MAX_LISTED_PATH_BYTES: usize = crate::tar::sanitize::DEFAULT_MAX_PATH_BYTES;
/// Longest error text listed.
pub(crate) const MAX_ERROR_BYTES: usize = 256;

/// What one listed record costs besides its escaped fields: length prefix, key, `=`, NULs, `\n`.
const RECORD_OVERHEAD: usize = 32;

const UNREADABLE_COUNT: &[u8] = b"SANDBOXRUN.notes.unreadable";
const SKIPPED_COUNT: &[u8] = b"SANDBOXRUN.notes.skipped";
const CHANGED_COUNT: &[u8] = b"SANDBOXRUN.notes.changed";
const UNREADABLE_ITEM: &[u8] = b"SANDBOXRUN.unreadable";
const SKIPPED_ITEM: &[u8] = b"SANDBOXRUN.skipped";
const CHANGED_ITEM: &[u8] = b"SANDBOXRUN.changed";

/// An entry the packer could not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableNote {
    /// Path relative to the root (raw bytes).
    pub path: Vec<u8>,
    /// The error, in words.
    pub error: String,
}

/// A special file the packer skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedNote {
    /// `fifo`, `socket`, `char_device`, `block_device` or `unknown`.
    pub kind: String,
    /// Path relative to the root (raw bytes).
    pub path: Vec<u8>,
}

/// How a packed file's content departed from its stat size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeReason {
    /// It ended early: the rest of the member is zero padding.
    Shrunk,
    /// It had more bytes than its stat size: the member holds the first ones.
    Grew,
    /// A read failed: the rest of the member is zero padding.
    ReadError,
    /// Read whole, but written meanwhile (same size, mtime or ctime moved): the member may mix
    /// old and new content.
    Modified,
}

impl ChangeReason {
    /// The word in the record and the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeReason::Shrunk => "shrunk",
            ChangeReason::Grew => "grew",
            ChangeReason::ReadError => "read_error",
            ChangeReason::Modified => "modified",
        }
    }

    fn parse(word: &[u8]) -> Option<Self> {
        match word {
            b"shrunk" => Some(ChangeReason::Shrunk),
            b"grew" => Some(ChangeReason::Grew),
            b"read_error" => Some(ChangeReason::ReadError),
            b"modified" => Some(ChangeReason::Modified),
            _ => None,
        }
    }
}

/// A file packed while it changed: its member is not its content at any one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedNote {
    /// Path relative to the root (raw bytes).
    pub path: Vec<u8>,
    /// What happened.
    pub reason: ChangeReason,
    /// The size at stat time: the member's size.
    pub stat_size: u64,
    /// Content bytes actually read into the member (the rest is padding; for `grew`, the stat
    /// size: the file had more).
    pub read: u64,
}

/// The packer's notes of one archive: counts, and the first entries of each kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InBandNotes {
    /// Unreadable entries, listed or not.
    pub unreadable: u64,
    /// Skipped special files, listed or not.
    pub skipped: u64,
    /// Changed files, listed or not.
    pub changed: u64,
    /// The first unreadable entries.
    pub listed_unreadable: Vec<UnreadableNote>,
    /// The first skipped files.
    pub listed_skipped: Vec<SkippedNote>,
    /// The first changed files.
    pub listed_changed: Vec<ChangedNote>,
    /// Bytes listed per kind (unreadable, skipped, changed), against [`MAX_LISTED_BYTES_PER_KIND`].
    used: [usize; 3],
}

/// Takes `cost` from the room of one kind, if it fits.
fn take(used: &mut usize, cost: usize) -> bool {
    if used.saturating_add(cost) > MAX_LISTED_BYTES_PER_KIND {
        return false;
    }
    *used += cost;
    true
}

/// `bytes` cut to `limit` bytes.
fn cut(bytes: &[u8], limit: usize) -> Vec<u8> {
    bytes[..bytes.len().min(limit)].to_vec()
}

/// `text` cut to at most `limit` bytes, on a character boundary, with NULs replaced.
fn cut_text(text: &str, limit: usize) -> String {
    crate::text::prefix(text, limit).replace('\0', " ")
}

impl InBandNotes {
    /// Counts an unreadable entry, listing it while its kind has room.
    pub fn push_unreadable(&mut self, path: &[u8], error: &str) {
        self.unreadable = self.unreadable.saturating_add(1);
        let note = UnreadableNote {
            path: cut(path, MAX_LISTED_PATH_BYTES),
            error: cut_text(error, MAX_ERROR_BYTES),
        };
        let cost = escaped_len(&note.path) + escaped_len(note.error.as_bytes()) + RECORD_OVERHEAD;
        if take(&mut self.used[0], cost) {
            self.listed_unreadable.push(note);
        }
    }

    /// Counts a skipped special file, listing it while its kind has room.
    pub fn push_skipped(&mut self, path: &[u8], kind: &str) {
        self.skipped = self.skipped.saturating_add(1);
        let note = SkippedNote {
            kind: cut_text(kind, 32),
            path: cut(path, MAX_LISTED_PATH_BYTES),
        };
        let cost = escaped_len(&note.path) + escaped_len(note.kind.as_bytes()) + RECORD_OVERHEAD;
        if take(&mut self.used[1], cost) {
            self.listed_skipped.push(note);
        }
    }

    /// Counts a changed file, listing it while its kind has room (a path too long to list whole
    /// is only counted: a cut path would name another file).
    pub fn push_changed(&mut self, note: ChangedNote) {
        self.changed = self.changed.saturating_add(1);
        // The reason and two sizes (at most 20 digits each) on top of the record's overhead.
        let cost = escaped_len(&note.path) + RECORD_OVERHEAD + 64;
        if note.path.len() <= MAX_LISTED_PATH_BYTES && take(&mut self.used[2], cost) {
            self.listed_changed.push(note);
        }
    }

    /// Whether there is nothing to note.
    pub fn is_empty(&self) -> bool {
        self.unreadable == 0 && self.skipped == 0 && self.changed == 0
    }

    /// The PAX records of the marker entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = ustar::record(NOTES_KEY, NOTES_VERSION);
        for (key, count) in [
            (UNREADABLE_COUNT, self.unreadable),
            (SKIPPED_COUNT, self.skipped),
            (CHANGED_COUNT, self.changed),
        ] {
            out.extend(ustar::record(key, count.to_string().as_bytes()));
        }
        for n in &self.listed_unreadable {
            out.extend(ustar::record(
                UNREADABLE_ITEM,
                &join(&[&n.path, n.error.as_bytes()]),
            ));
        }
        for n in &self.listed_skipped {
            out.extend(ustar::record(
                SKIPPED_ITEM,
                &join(&[n.kind.as_bytes(), &n.path]),
            ));
        }
        for n in &self.listed_changed {
            let (size, read) = (n.stat_size.to_string(), n.read.to_string());
            let fields = [
                n.reason.as_str().as_bytes(),
                size.as_bytes(),
                read.as_bytes(),
                &n.path,
            ];
            out.extend(ustar::record(CHANGED_ITEM, &join(&fields)));
        }
        out
    }

    /// The notes in the PAX records of a root entry, if they are the packer's notes (they hold
    /// [`NOTES_KEY`]). Malformed records are skipped; declared counts never go below the listed.
    pub fn decode<'r>(records: impl IntoIterator<Item = (&'r [u8], &'r [u8])>) -> Option<Self> {
        let mut notes = InBandNotes::default();
        let mut marked = false;
        let mut declared = [0u64; 3];
        for (key, value) in records {
            match key {
                NOTES_KEY => marked = true,
                // The largest declared count: no record can lower another.
                UNREADABLE_COUNT => declared[0] = declared[0].max(parse_count(value)),
                SKIPPED_COUNT => declared[1] = declared[1].max(parse_count(value)),
                CHANGED_COUNT => declared[2] = declared[2].max(parse_count(value)),
                UNREADABLE_ITEM => notes.decode_unreadable(value),
                SKIPPED_ITEM => notes.decode_skipped(value),
                CHANGED_ITEM => notes.decode_changed(value),
                _ => {}
            }
        }
        if !marked {
            return None;
        }
        notes.unreadable = notes.unreadable.max(declared[0]);
        notes.skipped = notes.skipped.max(declared[1]);
        notes.changed = notes.changed.max(declared[2]);
        Some(notes)
    }

    fn decode_unreadable(&mut self, value: &[u8]) {
        if let Some([path, error]) = split(value, 2).as_deref() {
            self.push_unreadable(path, &String::from_utf8_lossy(error));
        }
    }

    fn decode_skipped(&mut self, value: &[u8]) {
        if let Some([kind, path]) = split(value, 2).as_deref() {
            self.push_skipped(path, &String::from_utf8_lossy(kind));
        }
    }

    fn decode_changed(&mut self, value: &[u8]) {
        let fields = split(value, 4);
        let Some([reason, size, read, path]) = fields.as_deref() else {
            return;
        };
        let Some(reason) = ChangeReason::parse(reason) else {
            return;
        };
        self.push_changed(ChangedNote {
            path: path.clone(),
            reason,
            stat_size: parse_count(size),
            read: parse_count(read),
        });
    }

    /// Adds the notes of another marker of the same stream (counts add up; lists within bounds).
    pub fn absorb(&mut self, other: InBandNotes) {
        let listed = (
            other.listed_unreadable.len() as u64,
            other.listed_skipped.len() as u64,
            other.listed_changed.len() as u64,
        );
        for n in other.listed_unreadable {
            self.push_unreadable(&n.path, &n.error);
        }
        for n in other.listed_skipped {
            self.push_skipped(&n.path, &n.kind);
        }
        for n in other.listed_changed {
            self.push_changed(n);
        }
        self.unreadable = self
            .unreadable
            .saturating_add(other.unreadable.saturating_sub(listed.0));
        self.skipped = self
            .skipped
            .saturating_add(other.skipped.saturating_sub(listed.1));
        self.changed = self
            .changed
            .saturating_add(other.changed.saturating_sub(listed.2));
    }
}

/// The fields of a record, escaped and NUL-separated.
fn join(fields: &[&[u8]]) -> Vec<u8> {
    let escaped: Vec<Vec<u8>> = fields.iter().map(|f| escape(f)).collect();
    escaped.join(&0u8)
}

/// Splits a record's value into `n` fields and unescapes them; None unless there are `n`.
fn split(value: &[u8], n: usize) -> Option<Vec<Vec<u8>>> {
    let fields: Vec<Vec<u8>> = value.split(|b| *b == 0).map(unescape).collect();
    (fields.len() == n).then_some(fields)
}

/// Whether [`escape`] escapes `b`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == 0x7f || b == b'%'
}

/// The length of `bytes` once escaped: what it costs against [`MAX_LISTED_BYTES_PER_KIND`], so
/// the encoded notes stay under the drain's bound on a PAX body whatever the names hold.
fn escaped_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .map(|&b| if needs_escape(b) { 3 } else { 1 })
        .sum()
}

/// Percent-escapes control bytes (newline and NUL among them), DEL and `%`.
pub(crate) fn escape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if needs_escape(b) {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Undoes [`escape`]; a `%` not followed by two hex digits stays as is.
pub(crate) fn unescape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn parse_count(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (key, value) pairs of PAX records, parsed by the `tar` crate.
    fn parse(records: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        tar::PaxExtensions::new(records)
            .map(|r| {
                let r = r.expect("record");
                (r.key_bytes().to_vec(), r.value_bytes().to_vec())
            })
            .collect()
    }

    fn decode(records: &[u8]) -> Option<InBandNotes> {
        let pairs = parse(records);
        InBandNotes::decode(pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }

    #[test]
    fn notes_round_trip_through_pax_records() {
        let mut notes = InBandNotes::default();
        notes.push_unreadable(b"secret.txt", "Permission denied (os error 13)");
        notes.push_skipped(b"a pipe\n20 SANDBOXRUN.x=y\0%41", "fifo");
        notes.push_changed(ChangedNote {
            path: b"log/run.log".to_vec(),
            reason: ChangeReason::Shrunk,
            stat_size: 100,
            read: 40,
        });
        let back = decode(&notes.encode()).expect("notes");
        assert_eq!(back, notes);
        assert_eq!(decode(&ustar::record(b"path", b"x")), None, "no marker");
    }

    #[test]
    fn a_name_with_a_newline_can_neither_break_its_record_nor_smuggle_one_in() {
        let mut notes = InBandNotes::default();
        // Without escaping, the parser would read `34 SANDBOXRUN.notes.unreadable=0` as a record.
        let name = b"x\n34 SANDBOXRUN.notes.unreadable=0\n";
        notes.push_unreadable(name, "Permission denied");
        notes.push_unreadable(b"second", "Permission denied");
        let encoded = notes.encode();
        assert!(!encoded[..encoded.len() - 1]
            .split(|b| *b == b'\n')
            .any(|line| line.starts_with(b"34 ")));
        let back = decode(&encoded).expect("notes");
        assert_eq!(back.unreadable, 2);
        assert_eq!(back.listed_unreadable[0].path, name);
        assert_eq!(unescape(&escape(b"%zz%4")), b"%zz%4");
    }

    #[test]
    fn the_encoded_notes_stay_under_the_drains_pax_bound_whatever_the_names_hold() {
        let mut notes = InBandNotes::default();
        // Names of 255 control bytes: three bytes each once escaped.
        for i in 0..2_000u32 {
            let mut name = vec![1u8; 251];
            name.extend_from_slice(&i.to_be_bytes());
            notes.push_unreadable(&name, &"\u{1}".repeat(MAX_ERROR_BYTES));
            notes.push_skipped(&name, "fifo");
            notes.push_changed(ChangedNote {
                path: name.clone(),
                reason: ChangeReason::ReadError,
                stat_size: u64::MAX,
                read: u64::MAX,
            });
        }
        let encoded = notes.encode();
        assert!(
            (encoded.len() as u64) < crate::drain::archive::MAX_EXTENSION_BODY_BYTES,
            "{} bytes",
            encoded.len()
        );
        let back = decode(&encoded).expect("notes");
        assert_eq!(
            (back.unreadable, back.skipped, back.changed),
            (2_000, 2_000, 2_000)
        );
        assert!(!back.listed_unreadable.is_empty() && !back.listed_changed.is_empty());
    }

    #[test]
    fn a_flood_of_one_kind_never_pushes_another_out() {
        let mut notes = InBandNotes::default();
        for i in 0..10_000 {
            notes.push_skipped(
                format!("fifo-{i:05}-{}", "n".repeat(200)).as_bytes(),
                "fifo",
            );
        }
        notes.push_unreadable(b"the-one-unreadable", "Permission denied");
        let encoded = notes.encode();
        assert!(encoded.len() < 48 * 1024, "{}", encoded.len());
        let back = decode(&encoded).expect("notes");
        assert_eq!((back.skipped, back.unreadable), (10_000, 1));
        assert_eq!(back.listed_unreadable[0].path, b"the-one-unreadable");
        assert!(back.listed_skipped.len() < 100);
    }

    #[test]
    fn a_declared_count_never_hides_what_is_listed_and_markers_add_up() {
        let mut records = ustar::record(NOTES_KEY, NOTES_VERSION);
        records.extend(ustar::record(UNREADABLE_COUNT, b"0"));
        records.extend(ustar::record(UNREADABLE_ITEM, b"a\0denied"));
        records.extend(ustar::record(UNREADABLE_ITEM, b"b\0denied"));
        records.extend(ustar::record(CHANGED_ITEM, b"bogus\x001\x002\0c"));
        records.extend(ustar::record(UNREADABLE_COUNT, b"1"));
        let mut notes = decode(&records).expect("notes");
        assert_eq!((notes.unreadable, notes.changed), (2, 0));
        notes.absorb(InBandNotes {
            unreadable: 5,
            ..InBandNotes::default()
        });
        assert_eq!(notes.unreadable, 7);
    }
}
