//! The restore's stream (docs/contract.md "Pause, resume and fork"): a stored archive of one
//! read-back path read from the store, decompressed, judged member by member by the drain's
//! sanitizer and checked against its manifest (each member in its place, each file's size and
//! sha256, the path's cap), re-emitted as a clean tar of regular files and directories only for
//! `restore-unpack` in the holder (`crate::inpod::unpack`). A stored archive is untrusted input:
//! the tenant holds its store's credentials. The stream is constant in memory (64 KiB at a time);
//! a file whose content does not match its record is refused once read, after its bytes went to
//! the pod — the caller then never starts the workload as restored, and the attempt's own files
//! are never a later restore's source. Symlinks are listed and not restored (counted).

use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::store::{Manifest, MemberRecord};
use crate::tar::entry::RawEntry;
use crate::tar::sanitize::{Decision, Limits, MemberKind, Sanitizer};
use crate::text::printable;

/// Why a restore of one path failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    /// The store could not give the archive, or it is not a tar.
    #[error("archive {key}: {why}")]
    Archive {
        /// The archive's key.
        key: String,
        /// What went wrong.
        why: String,
    },
    /// A member the manifest does not list there, or one the sanitizer refuses.
    #[error("archive {key}: {why}")]
    NotListed {
        /// The archive's key.
        key: String,
        /// What it holds.
        why: String,
    },
    /// A file whose size or sha256 is not its record's.
    #[error("{path}: {size} bytes with sha256 {sha}, but the manifest says {want_size} bytes with sha256 {want_sha}")]
    Mismatch {
        /// The member.
        path: String,
        /// What was read.
        size: u64,
        /// Its hash.
        sha: String,
        /// The record's size.
        want_size: u64,
        /// The record's hash.
        want_sha: String,
    },
    /// More content than the path's cap.
    #[error("more than the path's cap of {0} bytes")]
    OverCap(u64),
    /// The pod's side stopped taking the stream.
    #[error("writing to restore-unpack: {0}")]
    Write(#[source] std::io::Error),
}

/// What one path's restore carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Carried {
    /// Regular files.
    pub files: u64,
    /// Bytes of their content.
    pub bytes: u64,
    /// Symlinks listed and not restored.
    pub links_skipped: u64,
}

/// Streams the archive `manifest` names from `store`, checked, into `out` as a clean tar; ends
/// it (the two zero blocks) only once every member was checked.
pub(crate) async fn restore_path<W: AsyncWrite + Unpin>(
    store: &Arc<dyn ObjectStore>,
    manifest: &Manifest,
    out: &mut W,
) -> Result<Carried, RestoreError> {
    let key = object_store::path::Path::from(manifest.archive_key.as_str());
    let archive_err = |why: String| RestoreError::Archive {
        key: key.to_string(),
        why,
    };
    let reader = crate::files::open_archive(store, manifest, &key)
        .await
        .map_err(|e| archive_err(e.to_string()))?;
    let mut archive = tokio_tar::Archive::new(reader);
    let mut entries = archive.entries().map_err(|e| archive_err(e.to_string()))?;
    let mut state = Restoring {
        key: key.to_string(),
        expected: manifest.members.iter(),
        sanitizer: Sanitizer::new(Limits::default()),
        cap: manifest.cap_bytes,
        carried: Carried::default(),
        seen: 0,
    };
    while let Some(entry) = entries.next().await {
        let entry = entry.map_err(|e| archive_err(format!("corrupt: {e}")))?;
        state.member(entry, out).await?;
    }
    if state.seen != manifest.members.len() {
        return Err(RestoreError::NotListed {
            key: key.to_string(),
            why: format!(
                "it holds {} member(s) but its manifest lists {}",
                state.seen,
                manifest.members.len()
            ),
        });
    }
    out.write_all(&[0u8; 1024])
        .await
        .map_err(RestoreError::Write)?;
    out.flush().await.map_err(RestoreError::Write)?;
    Ok(state.carried)
}

/// One restore's progress through the archive.
struct Restoring<'a> {
    key: String,
    expected: std::slice::Iter<'a, MemberRecord>,
    sanitizer: Sanitizer,
    cap: u64,
    carried: Carried,
    seen: usize,
}

impl Restoring<'_> {
    async fn member<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &mut self,
        mut entry: tokio_tar::Entry<R>,
        out: &mut W,
    ) -> Result<(), RestoreError> {
        let not_listed = |key: &str, why: String| RestoreError::NotListed {
            key: key.to_string(),
            why,
        };
        let raw = RawEntry::read(&entry).map_err(|e| not_listed(&self.key, e.to_string()))?;
        let accepted = match raw.judge(&mut self.sanitizer) {
            Decision::Accept(a) => a,
            Decision::Ignore => return Ok(()),
            Decision::Reject(reason) => {
                let path = printable(&String::from_utf8_lossy(&raw.path)).into_owned();
                return Err(not_listed(
                    &self.key,
                    format!("an unsafe member {path} ({reason})"),
                ));
            }
        };
        let rel = accepted.path.trim_end_matches('/').to_string();
        self.seen += 1;
        let record = match self.expected.next() {
            Some(r) if r.path.trim_end_matches('/') == rel && r.kind == accepted.kind => r,
            _ => {
                let shown = printable(&rel).into_owned();
                return Err(not_listed(
                    &self.key,
                    format!("{shown}, which its manifest does not list there"),
                ));
            }
        };
        let mode = entry.header().mode().unwrap_or(0o600) & 0o777;
        match accepted.kind {
            MemberKind::Symlink => self.carried.links_skipped += u64::from(!record.superseded),
            MemberKind::Dir => out
                .write_all(&header(
                    &format!("{rel}/"),
                    tar::EntryType::Directory,
                    mode,
                    0,
                ))
                .await
                .map_err(RestoreError::Write)?,
            MemberKind::File => {
                let emit = !record.superseded;
                if emit {
                    if self.carried.bytes.saturating_add(record.size) > self.cap {
                        return Err(RestoreError::OverCap(self.cap));
                    }
                    let head = header(&rel, tar::EntryType::Regular, mode, record.size);
                    out.write_all(&head).await.map_err(RestoreError::Write)?;
                }
                let (size, sha) =
                    copy_checked(&mut entry, record, emit.then_some(&mut *out)).await?;
                if size != record.size || record.sha256.as_deref() != Some(sha.as_str()) {
                    return Err(RestoreError::Mismatch {
                        path: printable(&rel).into_owned(),
                        size,
                        sha,
                        want_size: record.size,
                        want_sha: printable(record.sha256.as_deref().unwrap_or("-")).into_owned(),
                    });
                }
                if emit {
                    self.carried.files += 1;
                    self.carried.bytes += size;
                }
            }
        }
        Ok(())
    }
}

/// Reads a member to its end, hashing it; writes at most its record's size to `out` (padded to
/// the block), so the re-emitted tar stays well-formed whatever the member holds. Returns the
/// size read and its hex sha256.
async fn copy_checked<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    entry: &mut R,
    record: &MemberRecord,
    mut out: Option<&mut W>,
) -> Result<(u64, String), RestoreError> {
    let mut hasher = Sha256::new();
    let (mut total, mut sent) = (0u64, 0u64);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = entry
            .read(&mut buf)
            .await
            .map_err(|e| RestoreError::Archive {
                key: record.path.clone(),
                why: e.to_string(),
            })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        if let Some(out) = out.as_deref_mut() {
            let room = record.size.saturating_sub(sent).min(n as u64) as usize;
            out.write_all(&buf[..room])
                .await
                .map_err(RestoreError::Write)?;
            sent += room as u64;
        }
    }
    if let Some(out) = out {
        // A short member: the tar stays well-formed (zeros), and the size check refuses it.
        let mut left = (record.size - sent) + (512 - record.size % 512) % 512;
        while left > 0 {
            let n = left.min(buf.len() as u64);
            buf[..n as usize].fill(0);
            out.write_all(&buf[..n as usize])
                .await
                .map_err(RestoreError::Write)?;
            left -= n;
        }
    }
    Ok((total, hex::encode(hasher.finalize())))
}

/// The header blocks of one member: a PAX header and its records first when the path or size
/// does not fit ustar (`crate::tar::ustar`).
fn header(path: &str, kind: tar::EntryType, mode: u32, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    let pax = crate::tar::ustar::fill(h.as_mut_bytes(), path.as_bytes(), None, size);
    h.set_size(size.min(crate::tar::ustar::USTAR_MAX_SIZE));
    h.set_cksum();
    let mut out = Vec::new();
    if !pax.is_empty() {
        out.extend_from_slice(&crate::tar::ustar::pax_header(pax.len() as u64));
        out.extend_from_slice(&pax);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(h.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::files::tests::stored;

    async fn restored(
        manifest: &Manifest,
        store: &Arc<dyn ObjectStore>,
    ) -> Result<(Carried, Vec<u8>), RestoreError> {
        let mut out = Vec::new();
        let carried = restore_path(store, manifest, &mut out).await?;
        Ok((carried, out))
    }

    #[tokio::test]
    async fn a_restored_path_holds_the_stored_files_with_their_modes() {
        let (store, manifest) = stored(&[
            ("d/", b'5', 0o750, b""),
            ("d/a", b'0', 0o640, b"alpha"),
            ("b", b'0', 0o600, &[7u8; 70_000]),
        ])
        .await;
        let (carried, tar) = restored(&manifest, &store).await.unwrap();
        assert_eq!((carried.files, carried.bytes), (2, 70_005));
        let dir = tempfile::tempdir().unwrap();
        let done = crate::inpod::unpack::unpack(dir.path(), &tar[..], 1 << 20).unwrap();
        assert_eq!((done.files, done.bytes), (2, 70_005));
        assert_eq!(std::fs::read(dir.path().join("d/a")).unwrap(), b"alpha");
        assert_eq!(
            std::fs::read(dir.path().join("b")).unwrap(),
            vec![7u8; 70_000]
        );
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!((mode("d"), mode("d/a"), mode("b")), (0o750, 0o640, 0o600));
    }

    #[tokio::test]
    async fn a_file_whose_sha_is_not_its_records_fails_the_restore_and_the_tar_is_never_ended() {
        let (store, mut manifest) =
            stored(&[("a", b'0', 0o600, b"alpha"), ("b", b'0', 0o600, b"beta")]).await;
        manifest.members[1].sha256 = Some(hex::encode(Sha256::digest(b"other")));
        let mut out = Vec::new();
        let err = restore_path(&store, &manifest, &mut out).await.unwrap_err();
        assert!(matches!(err, RestoreError::Mismatch { .. }), "{err}");
        assert!(
            !out.ends_with(&[0u8; 1024]),
            "no end of archive after a refusal"
        );
    }

    #[tokio::test]
    async fn a_member_its_manifest_does_not_list_fails_the_restore() {
        let (store, mut manifest) =
            stored(&[("a", b'0', 0o600, b"alpha"), ("b", b'0', 0o600, b"beta")]).await;
        manifest.members.remove(0);
        let err = restored(&manifest, &store).await.unwrap_err();
        assert!(matches!(err, RestoreError::NotListed { .. }), "{err}");
        let (store, mut manifest) = stored(&[("a", b'0', 0o600, b"alpha")]).await;
        manifest.members.push(manifest.members[0].clone());
        let err = restored(&manifest, &store).await.unwrap_err();
        assert!(
            matches!(err, RestoreError::NotListed { .. }),
            "a listed member missing: {err}"
        );
    }

    #[tokio::test]
    async fn a_restore_past_the_paths_cap_fails() {
        let (store, mut manifest) = stored(&[("a", b'0', 0o600, b"alpha")]).await;
        manifest.cap_bytes = 4;
        let err = restored(&manifest, &store).await.unwrap_err();
        assert!(matches!(err, RestoreError::OverCap(4)), "{err}");
    }
}
