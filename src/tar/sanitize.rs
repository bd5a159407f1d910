//! The tar entry sanitizer: decides, for one entry of the UNTRUSTED stream the holder sends, whether
//! it may be stored. Pure: bytes in, a decision out; no I/O, no clock.
//!
//! Rules (each rejection names a stable [`Reason`] that lands in the manifest, so a reader can tell
//! "the sandbox wrote something unsafe" from "the sandbox wrote nothing" — ADR-143 §4):
//! - a path is a sequence of normal components separated by `/`. Absolute paths, `..`, NUL bytes,
//!   backslashes and drive prefixes (`C:`) are rejected; `.` components and repeated or trailing `/`
//!   are normalized away (GNU tar writes `./a/b` for `tar -C dir .`), so `./a//b/` is stored as `a/b`.
//!   A directory entry that normalizes to nothing (`./`) is the archive root itself: [`Decision::Ignore`].
//!   Paths must be UTF-8 (the manifest is JSON and two lossy renderings must never collide).
//! - only regular files, directories and symbolic links are stored; hard links, devices, fifos, GNU
//!   sparse files and unknown types are rejected.
//! - a symbolic link is kept only when its target is relative and written as `../`* followed by
//!   normal components, and the `../` part does not climb above the archive root from the link's
//!   directory. Targets like `a/../b` are rejected even when they look harmless lexically: `a` may be
//!   (or later become) a symlink itself, and `..` after a symlink resolves physically, not lexically.
//! - an entry whose path is at or below an accepted symlink is rejected: "link, then a file through
//!   it" is the classic extraction escape.
//! - limits: entry count, path length, component length.
//! - a member the packer dropped in the pod (`pack --budget`) arrives as a zero-length regular file
//!   carrying the PAX record `SANDBOXRUN.dropped=<size>`. [`dropped_in_pod`] validates that record
//!   (only after the entry itself was accepted, so the path it lists is as safe as any member's):
//!   decimal digits only, at most `i64::MAX` (no file is larger), on a regular file of size 0.
//!   Anything else is [`Reason::InvalidDropRecord`]. A hostile pod can forge the record; all it
//!   achieves is to lose its own file, and the size it claims is listed as the pod's word.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};

/// Default most entries one drained archive may hold (beyond it the drain fails: a stream with more
/// entries is hostile or broken; the records the operator keeps are bounded separately, by the
/// metadata allowance and the listed-record bound: docs/contract.md, "Unbounded size").
pub(crate) const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
/// Default longest path, in bytes (Linux PATH_MAX).
pub(crate) const DEFAULT_MAX_PATH_BYTES: usize = 4096;
/// Default longest path component, in bytes (Linux NAME_MAX).
pub(crate) const DEFAULT_MAX_COMPONENT_BYTES: usize = 255;

/// The type of a tar entry, as far as the sanitizer cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Regular file (`0`, or NUL in old archives).
    File,
    /// Directory (`5`).
    Directory,
    /// Symbolic link (`2`).
    Symlink,
    /// Hard link (`1`).
    HardLink,
    /// Character device (`3`).
    CharDevice,
    /// Block device (`4`).
    BlockDevice,
    /// Named pipe (`6`).
    Fifo,
    /// GNU sparse file (`S`, or a regular entry carrying `GNU.sparse.*` PAX records).
    Sparse,
    /// Anything else (contiguous files, global PAX headers, vendor types), with its type byte.
    Other(u8),
}

impl EntryKind {
    /// Maps a tar type flag byte to a kind.
    pub fn from_type_byte(byte: u8) -> EntryKind {
        match byte {
            b'0' | b'\0' => EntryKind::File,
            b'1' => EntryKind::HardLink,
            b'2' => EntryKind::Symlink,
            b'3' => EntryKind::CharDevice,
            b'4' => EntryKind::BlockDevice,
            b'5' => EntryKind::Directory,
            b'6' => EntryKind::Fifo,
            b'S' => EntryKind::Sparse,
            other => EntryKind::Other(other),
        }
    }
}

/// Kind of a stored member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (target inside the archive).
    Symlink,
}

/// Why an entry was rejected. The snake_case string ([`Reason::as_str`]) is stable: it is written
/// into manifests and matched by readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The path starts with `/`.
    AbsolutePath,
    /// The path has a `..` component.
    ParentDir,
    /// The path is empty (or only `.` components) and the entry is not the root directory.
    EmptyPath,
    /// The path or link target holds a NUL byte.
    NulByte,
    /// The path holds a backslash or a drive prefix (`C:`): it would mean something else on Windows.
    WindowsPath,
    /// The path or link target is not UTF-8.
    InvalidUtf8,
    /// The path is longer than the path limit.
    PathTooLong,
    /// A path component is longer than the component limit.
    ComponentTooLong,
    /// A hard link (could alias a file outside the archive on extraction).
    HardLink,
    /// A character or block device.
    Device,
    /// A named pipe.
    Fifo,
    /// A symlink whose target is absolute, empty, or resolves outside the archive root.
    SymlinkEscape,
    /// The entry's path is at or below an accepted symlink.
    ThroughSymlink,
    /// More entries than the entry limit (fatal for the drain).
    TooManyEntries,
    /// GNU sparse file, contiguous file, global header or unknown type.
    UnsupportedType,
    /// A `SANDBOXRUN.dropped` PAX record that is malformed, out of range, or on an entry that is
    /// not a zero-length regular file.
    InvalidDropRecord,
    /// The path of a member stored earlier, where one of the two is a directory and the other is
    /// not (other duplicates are kept: the last one wins).
    DuplicatePath,
    /// On a case-insensitive or normalizing filesystem (macOS APFS, Windows) the path would name
    /// an accepted symlink or something below one: checked when extracting ([`Sanitizer::for_extraction`]).
    FoldsOntoSymlink,
}

impl Reason {
    /// The stable snake_case name of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AbsolutePath => "absolute_path",
            Reason::ParentDir => "parent_dir",
            Reason::EmptyPath => "empty_path",
            Reason::NulByte => "nul_byte",
            Reason::WindowsPath => "windows_path",
            Reason::InvalidUtf8 => "invalid_utf8",
            Reason::PathTooLong => "path_too_long",
            Reason::ComponentTooLong => "component_too_long",
            Reason::HardLink => "hard_link",
            Reason::Device => "device",
            Reason::Fifo => "fifo",
            Reason::SymlinkEscape => "symlink_escape",
            Reason::ThroughSymlink => "through_symlink",
            Reason::TooManyEntries => "too_many_entries",
            Reason::UnsupportedType => "unsupported_type",
            Reason::InvalidDropRecord => "invalid_drop_record",
            Reason::DuplicatePath => "duplicate_path",
            Reason::FoldsOntoSymlink => "folds_onto_symlink",
        }
    }

    /// Whether the drain must stop rather than record the entry and go on.
    pub(crate) fn is_fatal(self) -> bool {
        matches!(self, Reason::TooManyEntries)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry as read from the stream (what the sanitizer looks at).
#[derive(Clone, Copy, Debug)]
pub struct EntryInfo<'a> {
    /// Raw path bytes (after PAX/GNU long-name resolution by the parser).
    pub path: &'a [u8],
    /// Entry type.
    pub kind: EntryKind,
    /// Raw link target bytes, if the header has one.
    pub link_target: Option<&'a [u8]>,
    /// Content size announced by the (effective) header.
    pub size: u64,
}

/// An entry that may be stored, in normalized form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Normalized relative path, no leading/trailing `/`, no `.` components.
    pub path: String,
    /// What it is.
    pub kind: MemberKind,
    /// Symlink target, as written (validated).
    pub link_target: Option<String>,
}

/// The sanitizer's verdict on one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Store it.
    Accept(Accepted),
    /// Do not store it; record why.
    Reject(Reason),
    /// The root directory entry (`./`): nothing to store, nothing to report.
    Ignore,
}

/// Limits of the sanitizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most entries (of any kind, rejected ones included).
    pub max_entries: u64,
    /// Longest normalized path, bytes.
    pub max_path_bytes: usize,
    /// Longest component, bytes.
    pub max_component_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_path_bytes: DEFAULT_MAX_PATH_BYTES,
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
        }
    }
}

/// Stateful sanitizer for one archive: it remembers accepted symlinks so that a later entry cannot
/// pass through one, and counts entries.
///
/// Memory (docs/contract.md "Drain memory"): a symlink is remembered as a 64-bit hash of its path
/// under a per-sanitizer random key, never as the path, so each costs the same few bytes whatever
/// its name; and the drain forgets a symlink it did not store ([`Sanitizer::forget_symlink`]), so
/// the set holds at most the stored symlinks (bounded by the metadata allowance). A collision can
/// only reject an entry (`through_symlink`), never let one through: the safe direction.
#[derive(Debug, Default)]
pub struct Sanitizer {
    limits: Limits,
    entries: u64,
    /// Keyed hashes of the accepted symlinks' paths.
    symlinks: HashSet<u64>,
    /// Keyed hashes of the [`fold`]ed paths of the accepted symlinks, when extracting
    /// ([`Sanitizer::for_extraction`]).
    folded_symlinks: Option<HashSet<u64>>,
    /// The random key of the hashes.
    hasher: RandomState,
}

/// A path as a case-insensitive, normalizing filesystem compares it: lower-cased and in Unicode
/// canonical decomposition (NFD), so `Link`, `LINK` and `link`, or `é` and `e` + U+0301, are one.
pub fn fold(path: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    path.to_lowercase().nfd().collect()
}

impl Sanitizer {
    /// A sanitizer with the given limits.
    pub fn new(limits: Limits) -> Self {
        Sanitizer {
            limits,
            entries: 0,
            symlinks: HashSet::new(),
            folded_symlinks: None,
            hasher: RandomState::new(),
        }
    }

    /// A sanitizer for extracting onto a filesystem that may be case-insensitive or normalizing
    /// (`files get` on macOS or Windows): on top of the rules, an entry whose path folds onto an
    /// accepted symlink or below one ([`fold`]) is [`Reason::FoldsOntoSymlink`] — there it would
    /// be written through the link.
    pub(crate) fn for_extraction(limits: Limits) -> Self {
        Sanitizer {
            folded_symlinks: Some(HashSet::new()),
            ..Sanitizer::new(limits)
        }
    }

    /// Entries seen so far.
    pub(crate) fn entries_seen(&self) -> u64 {
        self.entries
    }

    /// Symlinks remembered (what the sanitizer holds per entry: one hash each).
    #[cfg(test)]
    pub(crate) fn symlinks_remembered(&self) -> usize {
        self.symlinks.len()
    }

    /// Forgets the accepted symlink at `path` because it was not stored (the drain dropped it over
    /// the metadata allowance): an entry below a link that is not in the archive cannot be written
    /// through it, so remembering it would only cost memory the pod chose (docs/contract.md
    /// "Drain memory"). When extracting, the folded path stays (extraction stores every symlink).
    pub(crate) fn forget_symlink(&mut self, path: &str) {
        let key = self.hasher.hash_one(path);
        self.symlinks.remove(&key);
    }

    /// Decides on the next entry of the archive (entries must be passed in stream order).
    pub fn check(&mut self, entry: &EntryInfo<'_>) -> Decision {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Decision::Reject(Reason::TooManyEntries);
        }
        match entry.kind {
            EntryKind::File | EntryKind::Directory | EntryKind::Symlink => {}
            EntryKind::HardLink => return Decision::Reject(Reason::HardLink),
            EntryKind::CharDevice | EntryKind::BlockDevice => {
                return Decision::Reject(Reason::Device)
            }
            EntryKind::Fifo => return Decision::Reject(Reason::Fifo),
            EntryKind::Sparse | EntryKind::Other(_) => {
                return Decision::Reject(Reason::UnsupportedType)
            }
        }
        let components = match normalize_path(entry.path, &self.limits) {
            Ok(c) => c,
            Err(reason) => return Decision::Reject(reason),
        };
        if components.is_empty() {
            return if entry.kind == EntryKind::Directory {
                Decision::Ignore
            } else {
                Decision::Reject(Reason::EmptyPath)
            };
        }
        let path = components.join("/");
        if self.is_at_or_below_symlink(&path) {
            return Decision::Reject(Reason::ThroughSymlink);
        }
        if self.folds_onto_symlink(&path) {
            return Decision::Reject(Reason::FoldsOntoSymlink);
        }
        let (kind, link_target) = match entry.kind {
            EntryKind::File => (MemberKind::File, None),
            EntryKind::Directory => (MemberKind::Dir, None),
            _ => {
                let target = entry.link_target.unwrap_or_default();
                match check_symlink_target(components.len() - 1, target) {
                    Ok(t) => (MemberKind::Symlink, Some(t)),
                    Err(reason) => return Decision::Reject(reason),
                }
            }
        };
        if kind == MemberKind::Symlink {
            if let Some(folded) = self.folded_symlinks.as_mut() {
                folded.insert(self.hasher.hash_one(fold(&path)));
            }
            self.symlinks.insert(self.hasher.hash_one(path.as_str()));
        }
        Decision::Accept(Accepted {
            path,
            kind,
            link_target,
        })
    }

    /// Whether `path` (normalized), folded, names an accepted symlink or something below one
    /// (only when extracting).
    fn folds_onto_symlink(&self, path: &str) -> bool {
        let Some(folded) = self.folded_symlinks.as_ref().filter(|f| !f.is_empty()) else {
            return false;
        };
        prefixes(path).any(|prefix| folded.contains(&self.hasher.hash_one(fold(prefix))))
    }

    /// Whether `path` (normalized) names an accepted symlink or something below one.
    fn is_at_or_below_symlink(&self, path: &str) -> bool {
        if self.symlinks.is_empty() {
            return false;
        }
        prefixes(path).any(|prefix| self.symlinks.contains(&self.hasher.hash_one(prefix)))
    }
}

/// The component prefixes of a normalized path, shortest first: `a`, `a/b`, `a/b/c` (slices of
/// it, nothing allocated).
fn prefixes(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(|(i, _)| &path[..i])
        .chain(std::iter::once(path))
}

/// Largest size a `SANDBOXRUN.dropped` record may declare: `off_t` is signed, so no file is larger.
pub(crate) const MAX_DECLARED_DROP_BYTES: u64 = i64::MAX as u64;
/// Longest value of a `SANDBOXRUN.dropped` record (`i64::MAX` has 19 digits).
const MAX_DROP_RECORD_DIGITS: usize = 19;

/// Validates the `SANDBOXRUN.dropped` PAX record of an accepted entry (see the module doc): the
/// size the packer says the dropped file had, or why the record is refused.
pub(crate) fn dropped_in_pod(kind: MemberKind, size: u64, value: &[u8]) -> Result<u64, Reason> {
    if kind != MemberKind::File || size != 0 {
        return Err(Reason::InvalidDropRecord);
    }
    if value.is_empty()
        || value.len() > MAX_DROP_RECORD_DIGITS
        || !value.iter().all(u8::is_ascii_digit)
    {
        return Err(Reason::InvalidDropRecord);
    }
    let declared = std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or(Reason::InvalidDropRecord)?;
    if declared > MAX_DECLARED_DROP_BYTES {
        return Err(Reason::InvalidDropRecord);
    }
    Ok(declared)
}

/// Whether a regular file at `raw` (as the packer writes it) would be accepted by the path rules,
/// so the packer's budget counts exactly what the operator's meter will count.
pub(crate) fn path_is_storable(raw: &[u8], limits: &Limits) -> bool {
    normalize_path(raw, limits).is_ok_and(|components| !components.is_empty())
}

/// Splits a raw path into normal components, enforcing the path rules (see the module doc).
fn normalize_path<'a>(raw: &'a [u8], limits: &Limits) -> Result<Vec<&'a str>, Reason> {
    if raw.contains(&0) {
        return Err(Reason::NulByte);
    }
    let text = std::str::from_utf8(raw).map_err(|_| Reason::InvalidUtf8)?;
    if text.starts_with('/') {
        return Err(Reason::AbsolutePath);
    }
    if text.contains('\\') {
        return Err(Reason::WindowsPath);
    }
    let mut components = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => continue,
            ".." => return Err(Reason::ParentDir),
            _ => {}
        }
        if components.is_empty() && is_drive_prefix(part) {
            return Err(Reason::WindowsPath);
        }
        if part.len() > limits.max_component_bytes {
            return Err(Reason::ComponentTooLong);
        }
        components.push(part);
    }
    let len = components
        .iter()
        .map(|c| c.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if len > limits.max_path_bytes {
        return Err(Reason::PathTooLong);
    }
    Ok(components)
}

/// `C:` or `c:anything`: a drive-relative path on Windows.
fn is_drive_prefix(component: &str) -> bool {
    let b = component.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'
}

/// Validates a symlink target for a link whose parent directory is `depth` components deep.
/// Accepted shape: `../`* then normal components, never climbing above the root.
fn check_symlink_target(depth: usize, raw: &[u8]) -> Result<String, Reason> {
    if raw.contains(&0) {
        return Err(Reason::NulByte);
    }
    let text = std::str::from_utf8(raw).map_err(|_| Reason::InvalidUtf8)?;
    if text.is_empty() || text.starts_with('/') || text.contains('\\') {
        return Err(Reason::SymlinkEscape);
    }
    if text.len() > DEFAULT_MAX_PATH_BYTES {
        return Err(Reason::PathTooLong);
    }
    let mut ups = 0usize;
    let mut descended = false;
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." if descended => return Err(Reason::SymlinkEscape),
            ".." => ups += 1,
            p if !descended && is_drive_prefix(p) => return Err(Reason::SymlinkEscape),
            _ => descended = true,
        }
    }
    if ups > depth {
        return Err(Reason::SymlinkEscape);
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> EntryInfo<'_> {
        EntryInfo {
            path: path.as_bytes(),
            kind: EntryKind::File,
            link_target: None,
            size: 1,
        }
    }

    fn link<'a>(path: &'a str, target: &'a str) -> EntryInfo<'a> {
        EntryInfo {
            path: path.as_bytes(),
            kind: EntryKind::Symlink,
            link_target: Some(target.as_bytes()),
            size: 0,
        }
    }

    fn verdict(entry: EntryInfo<'_>) -> Decision {
        Sanitizer::default_limits().check(&entry)
    }

    impl Sanitizer {
        fn default_limits() -> Self {
            Sanitizer::new(Limits::default())
        }
    }

    fn accepted_path(d: Decision) -> String {
        match d {
            Decision::Accept(a) => a.path,
            other => panic!("expected Accept, got {other:?}"),
        }
    }

    #[test]
    fn relative_normal_paths_are_accepted_and_dots_normalized_away() {
        assert_eq!(accepted_path(verdict(file("a/b.txt"))), "a/b.txt");
        assert_eq!(accepted_path(verdict(file("./a//b.txt"))), "a/b.txt");
        let dir = EntryInfo {
            kind: EntryKind::Directory,
            ..file("./a/sub/")
        };
        assert_eq!(accepted_path(verdict(dir)), "a/sub");
    }

    #[test]
    fn the_root_directory_entry_is_ignored_but_an_empty_file_path_is_rejected() {
        let root = EntryInfo {
            kind: EntryKind::Directory,
            ..file("./")
        };
        assert_eq!(verdict(root), Decision::Ignore);
        assert_eq!(verdict(file(".")), Decision::Reject(Reason::EmptyPath));
        assert_eq!(verdict(file("")), Decision::Reject(Reason::EmptyPath));
    }

    #[test]
    fn unsafe_paths_are_rejected_with_their_reason() {
        assert_eq!(
            verdict(file("/etc/passwd")),
            Decision::Reject(Reason::AbsolutePath)
        );
        assert_eq!(
            verdict(file("a/../../x")),
            Decision::Reject(Reason::ParentDir)
        );
        assert_eq!(verdict(file("..")), Decision::Reject(Reason::ParentDir));
        assert_eq!(verdict(file("a\0b")), Decision::Reject(Reason::NulByte));
        assert_eq!(verdict(file("C:/x")), Decision::Reject(Reason::WindowsPath));
        assert_eq!(
            verdict(file("a\\..\\x")),
            Decision::Reject(Reason::WindowsPath)
        );
        let latin1 = EntryInfo {
            path: b"caf\xe9",
            ..file("")
        };
        assert_eq!(verdict(latin1), Decision::Reject(Reason::InvalidUtf8));
    }

    #[test]
    fn path_and_component_limits_are_enforced() {
        let long_component = "x".repeat(256);
        assert_eq!(
            verdict(file(&long_component)),
            Decision::Reject(Reason::ComponentTooLong)
        );
        let ok_component = "x".repeat(255);
        assert!(matches!(verdict(file(&ok_component)), Decision::Accept(_)));
        let long_path = vec!["y".repeat(200); 21].join("/");
        assert!(long_path.len() > 4096);
        assert_eq!(
            verdict(file(&long_path)),
            Decision::Reject(Reason::PathTooLong)
        );
    }

    #[test]
    fn hard_links_devices_fifos_and_sparse_files_are_rejected() {
        let with = |kind| EntryInfo { kind, ..file("a") };
        assert_eq!(
            verdict(with(EntryKind::HardLink)),
            Decision::Reject(Reason::HardLink)
        );
        assert_eq!(
            verdict(with(EntryKind::CharDevice)),
            Decision::Reject(Reason::Device)
        );
        assert_eq!(
            verdict(with(EntryKind::BlockDevice)),
            Decision::Reject(Reason::Device)
        );
        assert_eq!(
            verdict(with(EntryKind::Fifo)),
            Decision::Reject(Reason::Fifo)
        );
        assert_eq!(
            verdict(with(EntryKind::Sparse)),
            Decision::Reject(Reason::UnsupportedType)
        );
        let global = with(EntryKind::from_type_byte(b'g'));
        assert_eq!(verdict(global), Decision::Reject(Reason::UnsupportedType));
    }

    #[test]
    fn symlink_inside_the_root_is_kept() {
        let d = verdict(link("a/b/l", "../c/d"));
        assert_eq!(
            d,
            Decision::Accept(Accepted {
                path: "a/b/l".into(),
                kind: MemberKind::Symlink,
                link_target: Some("../c/d".into()),
            })
        );
        assert!(matches!(verdict(link("a/l", "..")), Decision::Accept(_)));
        assert!(matches!(verdict(link("l", "./x")), Decision::Accept(_)));
    }

    #[test]
    fn symlink_escaping_the_root_is_rejected() {
        assert_eq!(
            verdict(link("l", "/etc")),
            Decision::Reject(Reason::SymlinkEscape)
        );
        assert_eq!(
            verdict(link("l", "..")),
            Decision::Reject(Reason::SymlinkEscape)
        );
        assert_eq!(
            verdict(link("a/l", "../../x")),
            Decision::Reject(Reason::SymlinkEscape)
        );
        assert_eq!(
            verdict(link("l", "")),
            Decision::Reject(Reason::SymlinkEscape)
        );
        assert_eq!(
            verdict(link("l", "C:/x")),
            Decision::Reject(Reason::SymlinkEscape)
        );
    }

    #[test]
    fn symlink_target_climbing_after_descending_is_rejected() {
        // `deep/deeper/s -> ../..` is inside, but `l -> deep/deeper/s/..` would resolve
        // PHYSICALLY through s to the root's parent: only `../`* then names is allowed.
        assert_eq!(
            verdict(link("l", "deep/deeper/s/..")),
            Decision::Reject(Reason::SymlinkEscape)
        );
    }

    #[test]
    fn link_then_file_through_it_is_rejected() {
        let mut s = Sanitizer::default_limits();
        assert!(matches!(
            s.check(&link("out", "inner")),
            Decision::Accept(_)
        ));
        assert_eq!(
            s.check(&file("out/passwd")),
            Decision::Reject(Reason::ThroughSymlink)
        );
        assert_eq!(
            s.check(&file("./out//x/y")),
            Decision::Reject(Reason::ThroughSymlink)
        );
        // The link itself cannot be replaced by another entry either.
        assert_eq!(
            s.check(&file("out")),
            Decision::Reject(Reason::ThroughSymlink)
        );
        assert_eq!(
            s.check(&link("out/l2", "x")),
            Decision::Reject(Reason::ThroughSymlink)
        );
        // A sibling with a common prefix is not "through" the link.
        assert!(matches!(s.check(&file("outside.txt")), Decision::Accept(_)));
    }

    #[test]
    fn symlinks_are_remembered_one_hash_each_and_a_forgotten_one_no_longer_blocks() {
        // docs/contract.md "Drain memory": what the sanitizer holds per symlink does not grow
        // with its name, and the drain forgets the ones it did not store.
        let mut s = Sanitizer::default_limits();
        let deep = vec!["s".repeat(255); 15].join("/");
        for i in 0..2_000 {
            let path = format!("{deep}/l{i}");
            assert!(matches!(s.check(&link(&path, "t")), Decision::Accept(_)));
        }
        assert_eq!(s.symlinks_remembered(), 2_000);
        assert_eq!(
            s.check(&file(&format!("{deep}/l7/x"))),
            Decision::Reject(Reason::ThroughSymlink)
        );
        for i in 0..1_999 {
            s.forget_symlink(&format!("{deep}/l{i}"));
        }
        assert_eq!(s.symlinks_remembered(), 1);
        // Not stored, so nothing can be written through it: an entry below it is a plain path.
        assert!(matches!(
            s.check(&file(&format!("{deep}/l7/x"))),
            Decision::Accept(_)
        ));
        // The one still remembered still blocks, at and below it.
        assert_eq!(
            s.check(&file(&format!("{deep}/l1999"))),
            Decision::Reject(Reason::ThroughSymlink)
        );
        assert_eq!(
            s.check(&file(&format!("{deep}/l1999/y/z"))),
            Decision::Reject(Reason::ThroughSymlink)
        );
        assert_eq!(
            prefixes("a/bb/c").collect::<Vec<_>>(),
            ["a", "a/bb", "a/bb/c"]
        );
    }

    #[test]
    fn when_extracting_a_path_that_folds_onto_a_symlink_is_rejected() {
        let mut s = Sanitizer::for_extraction(Limits::default());
        assert!(matches!(
            s.check(&link("a/Link", "../sub")),
            Decision::Accept(_)
        ));
        for colliding in ["a/link", "A/LINK", "a/LINK/x", "a/lInK/deep/er"] {
            assert_eq!(
                s.check(&file(colliding)),
                Decision::Reject(Reason::FoldsOntoSymlink),
                "{colliding}"
            );
        }
        // Unicode: é precomposed (U+00E9) and e + combining acute (U+0301) are one name on APFS.
        assert!(matches!(
            s.check(&link("caf\u{e9}", "a")),
            Decision::Accept(_)
        ));
        assert_eq!(
            s.check(&file("CAFE\u{301}/x")),
            Decision::Reject(Reason::FoldsOntoSymlink)
        );
        // Names that only share a prefix of characters, or another folding, are fine.
        assert!(matches!(s.check(&file("a/Linked")), Decision::Accept(_)));
        assert!(matches!(s.check(&file("b/link/x")), Decision::Accept(_)));
        assert!(matches!(s.check(&file("cafe")), Decision::Accept(_)));
        // The drain's sanitizer (case-sensitive, as the pod's filesystem) keeps them.
        let mut drain = Sanitizer::default_limits();
        assert!(matches!(
            drain.check(&link("a/Link", "../sub")),
            Decision::Accept(_)
        ));
        assert!(matches!(
            drain.check(&file("a/link/x")),
            Decision::Accept(_)
        ));
        assert_eq!(fold("A/Caf\u{e9}"), fold("a/cafe\u{301}"));
    }

    #[test]
    fn entries_beyond_the_limit_are_rejected_as_fatal() {
        let mut s = Sanitizer::new(Limits {
            max_entries: 2,
            ..Limits::default()
        });
        assert!(matches!(s.check(&file("a")), Decision::Accept(_)));
        assert!(matches!(s.check(&file("b")), Decision::Accept(_)));
        assert_eq!(
            s.check(&file("c")),
            Decision::Reject(Reason::TooManyEntries)
        );
        assert!(Reason::TooManyEntries.is_fatal());
        assert!(!Reason::SymlinkEscape.is_fatal());
    }

    #[test]
    fn a_drop_record_is_decimal_bounded_and_only_on_an_empty_regular_file() {
        assert_eq!(
            dropped_in_pod(MemberKind::File, 0, b"68719476736"),
            Ok(1 << 36)
        );
        assert_eq!(dropped_in_pod(MemberKind::File, 0, b"0"), Ok(0));
        assert_eq!(
            dropped_in_pod(MemberKind::File, 0, b"9223372036854775807"),
            Ok(MAX_DECLARED_DROP_BYTES)
        );
        for bad in [
            &b""[..],
            b"-1",
            b"+5",
            b" 5",
            b"5 ",
            b"0x10",
            b"1e9",
            b"9223372036854775808",
            b"18446744073709551616",
            b"000000000000000000001",
        ] {
            assert_eq!(
                dropped_in_pod(MemberKind::File, 0, bad),
                Err(Reason::InvalidDropRecord),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            dropped_in_pod(MemberKind::File, 1, b"5"),
            Err(Reason::InvalidDropRecord),
            "a placeholder carries no content"
        );
        assert_eq!(
            dropped_in_pod(MemberKind::Dir, 0, b"5"),
            Err(Reason::InvalidDropRecord)
        );
        assert_eq!(
            dropped_in_pod(MemberKind::Symlink, 0, b"5"),
            Err(Reason::InvalidDropRecord)
        );
    }

    #[test]
    fn storable_paths_are_the_ones_the_sanitizer_accepts() {
        let limits = Limits::default();
        assert!(path_is_storable(b"a/b.txt", &limits));
        assert!(!path_is_storable(b"caf\xe9", &limits));
        assert!(!path_is_storable(b"", &limits));
        assert!(!path_is_storable(vec![b'y'; 256].as_slice(), &limits));
    }

    #[test]
    fn reasons_have_stable_snake_case_names() {
        assert_eq!(Reason::ThroughSymlink.as_str(), "through_symlink");
        let json = serde_json::to_string(&Reason::SymlinkEscape).unwrap_or_default();
        assert_eq!(json, "\"symlink_escape\"");
        let json = serde_json::to_string(&Reason::TooManyEntries).unwrap_or_default();
        assert_eq!(json, format!("\"{}\"", Reason::TooManyEntries.as_str()));
    }
}
