//! The packer's walk of a read-back directory (docs/contract.md, "The packer walks what it
//! listed"): every directory is opened through the file descriptor of its parent (`openat` with
//! `O_NOFOLLOW | O_DIRECTORY`), listed through its own descriptor, and left only when its listing
//! is done. No path of more than one component is ever resolved again, so a workload that swaps a
//! directory for a symlink (to `/`, `/proc/self`) while the packer runs cannot make it read the
//! holder's own view: the walk either holds the directory it listed, or reports the name as
//! replaced.
//!
//! The walk decides nothing about the archive: it hands each name it found to the packer as a
//! [`Found`], with the metadata of what it saw (`lstat` of the name; for a directory, `fstat` of the
//! descriptor it will list). A regular file is handed over unopened, with its parent's descriptor
//! and name ([`At`]): the packer decides first whether to read it at all (`--budget`).
//!
//! Order: depth-first, a directory before its content, siblings sorted by name bytes. The walk
//! holds one descriptor per level of depth; it does not descend past [`MAX_WALK_PATH_BYTES`] of
//! relative path (the operator rejects longer paths anyway) and says so.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// Longest relative path the walk descends into (the sanitizer's longest stored path: a member
/// below it would be rejected by the operator).
pub(crate) const MAX_WALK_PATH_BYTES: usize = crate::tar::sanitize::DEFAULT_MAX_PATH_BYTES;

/// The error of a name that no longer is what the walk listed (swapped between the listing and
/// the open: for a symlink, a directory, a FIFO or a device).
pub(crate) const REPLACED: &str = "replaced while being packed";

/// What the walk needs of an entry's metadata (from `lstat` of its name or `fstat` of its
/// descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The file type.
    pub(crate) kind: FileType,
    /// Permission bits (and setuid/setgid/sticky).
    pub(crate) mode: u32,
    /// Owner.
    pub(crate) uid: u32,
    /// Group.
    pub(crate) gid: u32,
    /// Modification time, seconds since the epoch.
    pub(crate) mtime: i64,
    /// Its nanoseconds.
    pub(crate) mtime_nsec: i64,
    /// Status change time (any write, truncate, chmod, rename), seconds since the epoch.
    pub(crate) ctime: i64,
    /// Its nanoseconds.
    pub(crate) ctime_nsec: i64,
    /// Size in bytes.
    pub(crate) size: u64,
    /// Device of the filesystem.
    pub(crate) dev: u64,
    /// Inode number.
    pub(crate) ino: u64,
}

impl From<&Stat> for Meta {
    #[allow(clippy::unnecessary_cast)] // the field types differ between architectures
    fn from(st: &Stat) -> Self {
        Meta {
            kind: FileType::from_raw_mode(st.st_mode as _),
            mode: (st.st_mode as u32) & 0o7777,
            uid: st.st_uid as u32,
            gid: st.st_gid as u32,
            mtime: st.st_mtime as i64,
            mtime_nsec: st.st_mtime_nsec as i64,
            ctime: st.st_ctime as i64,
            ctime_nsec: st.st_ctime_nsec as i64,
            size: u64::try_from(st.st_size).unwrap_or(0),
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }
}

impl Meta {
    /// Whether `other` is the same file (device and inode).
    pub(crate) fn same_file(&self, other: &Meta) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Whether `later` (a stat of the same file taken later) shows no write since this one: the
    /// same size, mtime and ctime, to the nanosecond (docs/contract.md "A changed file is never
    /// stored as a clean one").
    pub(crate) fn unwritten_since(&self, later: &Meta) -> bool {
        self.size == later.size
            && (self.mtime, self.mtime_nsec) == (later.mtime, later.mtime_nsec)
            && (self.ctime, self.ctime_nsec) == (later.ctime, later.ctime_nsec)
    }
}

/// A name in a directory the walk holds open: what a regular file is opened from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct At<'a> {
    /// The directory the name was listed in.
    pub(crate) dir: BorrowedFd<'a>,
    /// The name.
    pub(crate) name: &'a CStr,
}

/// One name the walk found.
#[derive(Debug)]
pub(crate) enum Found<'a> {
    /// A directory the walk opened and listed; its content follows.
    Dir {
        /// Path relative to the root.
        rel: &'a Path,
        /// `fstat` of the descriptor the walk lists.
        meta: Meta,
    },
    /// A symlink (never followed).
    Symlink {
        /// Path relative to the root.
        rel: &'a Path,
        /// `lstat` of the name.
        meta: Meta,
        /// Its target, as read by `readlinkat`.
        target: Vec<u8>,
    },
    /// A regular file, not opened yet.
    File {
        /// Path relative to the root.
        rel: &'a Path,
        /// `lstat` of the name: what the opened descriptor must still be.
        lstat: Meta,
        /// Where to open it from.
        at: At<'a>,
    },
    /// A FIFO, socket or device.
    Special {
        /// Path relative to the root.
        rel: &'a Path,
        /// `fifo`, `socket`, `char_device`, `block_device` or `unknown`.
        kind: &'static str,
    },
    /// A name that could not be inspected, opened or listed.
    Unreadable {
        /// Path relative to the root.
        rel: &'a Path,
        /// The error, in words.
        error: String,
    },
}

/// Opens the root directory itself (its last component not followed).
pub(crate) fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rfs::open(root, dir_flags(), Mode::empty())?)
}

/// Opens a file the walk listed as regular, from its directory's descriptor: never following a
/// symlink swapped in (`O_NOFOLLOW`: ELOOP) and never blocking on a FIFO swapped in (`O_NONBLOCK`,
/// which does not change reads of a regular file). The caller checks the type and identity of
/// what was opened on the descriptor ([`fstat`]).
pub(crate) fn open_file_at(at: At<'_>) -> io::Result<std::fs::File> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    Ok(rfs::openat(at.dir, at.name, flags, Mode::empty())?.into())
}

/// `fstat` of an open descriptor.
pub(crate) fn fstat(fd: impl AsFd) -> io::Result<Meta> {
    Ok(Meta::from(&rfs::fstat(fd)?))
}

/// The names in the directory open at `dir` (`.` and `..` aside), sorted by their bytes.
pub(crate) fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let mut reader = Dir::read_from(dir)?;
    let mut names = Vec::new();
    while let Some(entry) = reader.read() {
        let name = entry?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// One directory being walked: its descriptor, its path, the names still to visit.
struct Frame {
    fd: OwnedFd,
    rel: PathBuf,
    names: std::vec::IntoIter<CString>,
}

/// Walks the directory open at `root`, whose `names` were listed by the caller, handing every
/// name found to `visit` in order. Only `visit`'s errors (writing the archive) stop the walk.
pub(crate) fn walk(
    root: OwnedFd,
    names: Vec<CString>,
    visit: &mut dyn FnMut(Found<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut stack = vec![Frame {
        fd: root,
        rel: PathBuf::new(),
        names: names.into_iter(),
    }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let rel = frame.rel.join(OsStr::from_bytes(name.as_bytes()));
        if let Some(child) = visit_name(frame.fd.as_fd(), &name, rel, visit)? {
            stack.push(child);
        }
    }
    Ok(())
}

/// Visits one name of the directory open at `dir`; returns the directory to walk next, if the
/// name is one the walk could open and list.
fn visit_name(
    dir: BorrowedFd<'_>,
    name: &CStr,
    rel: PathBuf,
    visit: &mut dyn FnMut(Found<'_>) -> io::Result<()>,
) -> io::Result<Option<Frame>> {
    let lstat = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Meta::from(&st),
        Err(e) => return unreadable(visit, &rel, e).map(|()| None),
    };
    let found = match lstat.kind {
        FileType::Directory => return descend(At { dir, name }, &lstat, rel, visit),
        FileType::Symlink => match rfs::readlinkat(dir, name, Vec::new()) {
            Ok(target) => Found::Symlink {
                rel: &rel,
                meta: lstat,
                target: target.into_bytes(),
            },
            Err(e) => return unreadable(visit, &rel, e).map(|()| None),
        },
        FileType::RegularFile => Found::File {
            rel: &rel,
            lstat,
            at: At { dir, name },
        },
        other => Found::Special {
            rel: &rel,
            kind: special_kind(other),
        },
    };
    visit(found).map(|()| None)
}

/// Opens the directory at `at` through its parent's descriptor, never following a symlink swapped
/// in, and lists it if it is still the directory listed (`lstat`); hands it to `visit` and returns
/// it to be walked.
fn descend(
    at: At<'_>,
    lstat: &Meta,
    rel: PathBuf,
    visit: &mut dyn FnMut(Found<'_>) -> io::Result<()>,
) -> io::Result<Option<Frame>> {
    if rel.as_os_str().len() > MAX_WALK_PATH_BYTES {
        let error = format!(
            "its path is longer than {MAX_WALK_PATH_BYTES} bytes (the longest the operator stores); not descended"
        );
        visit(Found::Unreadable { rel: &rel, error })?;
        return Ok(None);
    }
    let fd = match rfs::openat(at.dir, at.name, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => return unreadable(visit, &rel, e).map(|()| None),
    };
    let meta = match rfs::fstat(&fd) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => Meta::from(&st),
        Ok(_) => return unreadable(visit, &rel, Errno::NOTDIR).map(|()| None),
        Err(e) => return unreadable(visit, &rel, e).map(|()| None),
    };
    if !meta.same_file(lstat) {
        // Another directory was renamed onto the name between the listing and the open.
        return unreadable(visit, &rel, Errno::NOTDIR).map(|()| None);
    }
    match list(fd.as_fd()) {
        Ok(names) => {
            visit(Found::Dir { rel: &rel, meta })?;
            Ok(Some(Frame {
                fd,
                rel,
                names: names.into_iter(),
            }))
        }
        Err(e) => {
            visit(Found::Dir { rel: &rel, meta })?;
            let error = e.to_string();
            visit(Found::Unreadable { rel: &rel, error })?;
            Ok(None)
        }
    }
}

/// Reports `rel` unreadable: a name that is no longer what was listed (`ELOOP`: a symlink where a
/// directory or file was; `ENOTDIR`; `EINVAL` from `readlinkat` on a non-link) says so.
fn unreadable(
    visit: &mut dyn FnMut(Found<'_>) -> io::Result<()>,
    rel: &Path,
    e: Errno,
) -> io::Result<()> {
    let error = replaced_or(e);
    visit(Found::Unreadable { rel, error })
}

/// Words for an error on a listed name.
pub(crate) fn replaced_or(e: Errno) -> String {
    if matches!(e, Errno::LOOP | Errno::NOTDIR | Errno::INVAL) {
        REPLACED.to_string()
    } else {
        io::Error::from(e).to_string()
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC
}

fn special_kind(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "char_device",
        FileType::BlockDevice => "block_device",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// An archive buffer that refuses to grow past `limit` (a walk of the holder's `/` would not
    /// stop on its own).
    struct Bounded {
        buf: Vec<u8>,
        limit: usize,
    }

    impl Write for Bounded {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            if self.buf.len() + data.len() > self.limit {
                return Err(io::Error::other("the archive grew past the test's bound"));
            }
            self.buf.extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn names(archive: &[u8]) -> Vec<String> {
        let mut ar = tar::Archive::new(archive);
        ar.entries()
            .expect("entries")
            .map(|e| String::from_utf8_lossy(&e.expect("entry").path_bytes()).into_owned())
            .collect()
    }

    /// docs/contract.md, "The packer walks what it listed": a workload swaps a directory for a
    /// symlink to `/` in a loop while the packer runs; the archive never holds anything but the
    /// root's own names (the directory, its file, or the symlink itself).
    #[test]
    fn a_directory_swapped_for_a_symlink_to_slash_mid_walk_never_brings_the_holders_view_in() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        fs::create_dir(&root).expect("mkdir");
        // Files sorted before `d`: the root is listed well before the walk reaches `d`.
        let mut allowed: Vec<String> = (0..300).map(|i| format!("a{i:03}")).collect();
        for name in &allowed {
            fs::write(root.join(name), b"x").expect("write");
        }
        fs::create_dir(root.join("d")).expect("mkdir");
        fs::write(root.join("d/inside"), b"in").expect("write");
        // `./` is the packer's notes marker (crate::tar::notes), not a workload name.
        allowed.extend(["d", "d/", "d/inside", "./"].map(String::from));

        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (d, parked, stop) = (root.join("d"), dir.path().join("parked"), stop.clone());
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                // About half of the time a directory, half a symlink to `/`: a walk that lists
                // `d` as a directory often finds a symlink there when it descends.
                while !stop.load(Ordering::Relaxed) {
                    let _ = fs::rename(&d, &parked);
                    let _ = std::os::unix::fs::symlink("/", &d);
                    std::thread::sleep(Duration::from_micros(300));
                    let _ = fs::remove_file(&d);
                    let _ = fs::rename(&parked, &d);
                    std::thread::sleep(Duration::from_micros(300));
                    swaps += 1;
                }
                swaps
            })
        };
        let started = Instant::now();
        let mut runs = 0;
        let mut outcome = Ok(());
        while runs < 300 && started.elapsed() < Duration::from_secs(8) {
            let mut out = Bounded {
                buf: Vec::new(),
                limit: 4 << 20,
            };
            if let Err(e) = crate::inpod::pack::pack(&root, None, &mut out, io::sink()) {
                outcome = Err(format!("run {runs}: {e}"));
                break;
            }
            let outside: Vec<String> = names(&out.buf)
                .into_iter()
                .filter(|n| !allowed.contains(n))
                .take(5)
                .collect();
            if !outside.is_empty() {
                outcome = Err(format!(
                    "run {runs}: names from outside the root: {outside:?}"
                ));
                break;
            }
            runs += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().expect("swapper");
        assert!(swaps > 0, "the swapper ran");
        assert_eq!(outcome, Ok(()));
    }

    #[test]
    fn a_listed_directory_is_walked_through_its_descriptor_even_once_moved_away() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("d")).expect("mkdir");
        fs::write(root.join("d/f"), b"1").expect("write");
        let fd = open_root(&root).expect("open");
        let names = list(fd.as_fd()).expect("list");
        let mut seen = Vec::new();
        walk(fd, names, &mut |found| {
            if let Found::Dir { rel, .. } = &found {
                // Once `d` is open, its name is swapped for a symlink to `/`: the walk lists the
                // directory it holds, not whatever the name resolves to now.
                if *rel == Path::new("d") {
                    fs::rename(root.join("d"), dir.path().join("parked")).expect("rename");
                    std::os::unix::fs::symlink("/", root.join("d")).expect("symlink");
                }
            }
            seen.push(match &found {
                Found::Dir { rel, .. } => format!("dir {}", rel.display()),
                Found::File { rel, .. } => format!("file {}", rel.display()),
                other => format!("{other:?}"),
            });
            Ok(())
        })
        .expect("walk");
        assert_eq!(seen, ["dir d", "file d/f"], "d/f from the descriptor held");
    }
}
