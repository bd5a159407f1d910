//! `sandboxrun-operator restore-unpack <dir> --budget <bytes>`, exec'd by the operator in the
//! holder container (which runs as the run's user, so what it writes is the run's) to put a
//! saved generation back into a declared read-back path before the workload starts
//! (docs/contract.md "Pause, resume and fork"). Its stdin is the tar the operator re-emitted from
//! the stored archive after checking it against the manifest; it is judged again here, strictly:
//! only regular files and directories, at relative paths of normal components, each created
//! below directories opened without following any link (`O_NOFOLLOW`), a file never over an
//! existing one (`O_EXCL`), at most `budget` bytes of content in all. Anything else — `..`, an
//! absolute path, a symlink, a hard link, a device, a FIFO — ends the unpack with an error and
//! exit 1: the operator then never starts the workload as restored. Stored permission bits are
//! kept (`& 0o777`: never setuid, setgid or sticky); ownership is the holder's user.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Why an unpack stopped.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// A member this unpacker never writes (its path or kind).
    #[error("refused {path:?}: {why}")]
    Refused {
        /// The member's path, as the stream has it.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// More content than the path's cap.
    #[error("more than {0} bytes of content")]
    OverBudget(u64),
    /// A read of the stream or a write of the path failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What an unpack put in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Regular files written.
    pub files: u64,
    /// Directories made.
    pub dirs: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UnpackError {
    let what = what.into();
    move |source| UnpackError::Io { what, source }
}

fn refused(path: &[u8], why: &'static str) -> UnpackError {
    UnpackError::Refused {
        path: String::from_utf8_lossy(path).into_owned(),
        why,
    }
}

/// The normal components of a member's path, or why it is refused: relative, no `.` or `..`,
/// no empty component (a directory's one trailing `/` aside), no NUL.
pub fn components(path: &[u8]) -> Result<Vec<&[u8]>, UnpackError> {
    if path.is_empty() || path.starts_with(b"/") {
        return Err(refused(path, "not a relative path"));
    }
    if path.contains(&0) {
        return Err(refused(path, "a NUL in the path"));
    }
    let body = path.strip_suffix(b"/").unwrap_or(path);
    let parts: Vec<&[u8]> = body.split(|b| *b == b'/').collect();
    for part in &parts {
        match *part {
            b"" | b"." | b".." => return Err(refused(path, "a component that is not a name")),
            _ => {}
        }
    }
    Ok(parts)
}

/// Opens (creating it 0700 when missing) the directory `name` below `parent`, following no link.
fn open_dir(parent: &impl AsFd, name: &[u8]) -> std::io::Result<(OwnedFd, bool)> {
    let made = match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        Err(e) => return Err(e.into()),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok((
        rustix::fs::openat(parent, name, flags, Mode::empty())?,
        made,
    ))
}

/// Unpacks the tar on `input` into `dir` (see the module's words).
pub fn unpack(dir: &Path, input: impl Read, budget: u64) -> Result<Unpacked, UnpackError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = rustix::fs::open(dir, flags, Mode::empty())
        .map_err(|e| io(format!("open {}", dir.display()))(e.into()))?;
    let mut archive = tar::Archive::new(input);
    let mut done = Unpacked::default();
    let mut dir_modes: Vec<(Vec<Vec<u8>>, u32)> = Vec::new();
    for entry in archive.entries().map_err(io("read the stream"))? {
        let mut entry = entry.map_err(io("read the stream"))?;
        let path = entry.path_bytes().into_owned();
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().map_err(io("read a mode"))? & 0o777;
        let parts = components(&path)?;
        let (leaf, parents) = parts.split_last().ok_or_else(|| refused(&path, "empty"))?;
        let mut parent = rustix::io::dup(&root).map_err(|e| io("dup")(e.into()))?;
        for name in parents {
            let (fd, made) = open_dir(&parent, name).map_err(io(shown(&path)))?;
            done.dirs += u64::from(made);
            parent = fd;
        }
        match kind {
            tar::EntryType::Directory => {
                let (_, made) = open_dir(&parent, leaf).map_err(io(shown(&path)))?;
                done.dirs += u64::from(made);
                dir_modes.push((parts.iter().map(|p| p.to_vec()).collect(), mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(io("read a size"))?;
                if done.bytes.saturating_add(size) > budget {
                    return Err(UnpackError::OverBudget(budget));
                }
                let file = rustix::fs::openat(
                    &parent,
                    *leaf,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io(shown(&path))(e.into()))?;
                let mut file = std::fs::File::from(file);
                let wrote = std::io::copy(&mut (&mut entry).take(size), &mut file)
                    .map_err(io(shown(&path)))?;
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
                    .map_err(|e| io(shown(&path))(e.into()))?;
                done.files += 1;
                done.bytes += wrote;
            }
            _ => return Err(refused(&path, "not a regular file or a directory")),
        }
    }
    // Deepest first, so a directory that loses its owner's write bit does so last.
    dir_modes.sort_by_key(|(parts, _)| std::cmp::Reverse(parts.len()));
    for (parts, mode) in dir_modes {
        let mut fd = rustix::io::dup(&root).map_err(|e| io("dup")(e.into()))?;
        for name in &parts {
            fd = open_dir(&fd, name).map_err(io("chmod a directory"))?.0;
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| io("chmod a directory")(e.into()))?;
    }
    Ok(done)
}

fn shown(path: &[u8]) -> String {
    format!(
        "write {}",
        crate::text::printable(&String::from_utf8_lossy(path))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of one member of `kind` at `path` (raw bytes, as a hostile stream would have it).
    fn one(path: &[u8], kind: tar::EntryType, body: &[u8], link: Option<&str>) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.as_mut_bytes()[..path.len()].copy_from_slice(path);
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(body);
        out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
        out
    }

    fn refusal(tar: &[u8]) -> UnpackError {
        let dir = tempfile::tempdir().unwrap();
        let err = unpack(dir.path(), tar, 1 << 20).unwrap_err();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(
            left.is_empty(),
            "nothing written outside or inside: {left:?}"
        );
        err
    }

    #[test]
    fn the_unpacker_refuses_dotdot_absolute_links_and_devices() {
        let file = tar::EntryType::Regular;
        for path in [
            &b"../escape"[..],
            b"/etc/passwd",
            b"a/../../x",
            b"./a",
            b"a//b",
        ] {
            let err = refusal(&one(path, file, b"x", None));
            assert!(
                matches!(err, UnpackError::Refused { .. }),
                "{path:?}: {err}"
            );
        }
        for kind in [
            tar::EntryType::Symlink,
            tar::EntryType::Link,
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
        ] {
            let err = refusal(&one(b"x", kind, b"", Some("/etc/passwd")));
            assert!(
                matches!(err, UnpackError::Refused { .. }),
                "{kind:?}: {err}"
            );
        }
    }

    #[test]
    fn the_unpacker_never_writes_through_a_link_or_over_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("sub")).unwrap();
        let tar = one(b"sub/x", tar::EntryType::Regular, b"x", None);
        assert!(unpack(dir.path(), &tar[..], 1 << 20).is_err());
        assert!(!outside.path().join("x").exists());
        std::fs::write(dir.path().join("y"), b"old").unwrap();
        let tar = one(b"y", tar::EntryType::Regular, b"new", None);
        assert!(unpack(dir.path(), &tar[..], 1 << 20).is_err());
        assert_eq!(std::fs::read(dir.path().join("y")).unwrap(), b"old");
    }

    #[test]
    fn the_unpacker_writes_files_and_directories_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let mut tar = one(b"d/", tar::EntryType::Directory, b"", None);
        tar.truncate(512);
        tar.extend(one(b"d/f", tar::EntryType::Regular, b"hello", None));
        let done = unpack(dir.path(), &tar[..], 5).unwrap();
        assert_eq!((done.files, done.dirs, done.bytes), (1, 1, 5));
        assert_eq!(std::fs::read(dir.path().join("d/f")).unwrap(), b"hello");
        let other = tempfile::tempdir().unwrap();
        assert!(matches!(
            unpack(other.path(), &tar[..], 4),
            Err(UnpackError::OverBudget(4))
        ));
    }
}
