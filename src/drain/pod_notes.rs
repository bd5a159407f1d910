//! What the operator keeps of the packer's notes for one drained path (docs/contract.md, "The
//! packer's notes travel in-band"): the in-band notes of the archive's marker entry when the
//! packer wrote them ([`crate::tar::notes`]), else — a packer that predates them — its stderr,
//! as before. With in-band notes, stderr is for humans only (logged, never decided on): a flood
//! of FIFO names on stderr can no longer push an unreadable file's note out and turn a failure
//! into `Empty`.
//!
//! The changed files (shrunk, grew or failed mid-read: their member is zero-padded or cut) become
//! [`ChangedRecord`]s of the manifest, for the stored members they name. Pure.

use std::collections::HashSet;

use super::exec::PackNotes;
use crate::inpod::pack::UNREADABLE_NOTE;
use crate::store::manifest::{ChangedRecord, DrainOutcome, Manifest};
use crate::tar::notes::InBandNotes;
use crate::tar::sanitize::MemberKind;

/// The notes of one attempt, as the manifest and the path's outcome use them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodNotes {
    /// The manifest's `podNotes`: one line per note (unreadable ones start with
    /// [`UNREADABLE_NOTE`]), then how many were not listed.
    pub(crate) lines: Vec<String>,
    /// Unreadable entries counted but not in `lines`.
    pub(crate) unlisted_unreadable: u64,
    /// Stored members whose file changed while read.
    pub(crate) changed: Vec<ChangedRecord>,
    /// Changed files, listed or not.
    pub(crate) changed_total: u64,
    /// Whether these came in band (else from stderr).
    pub(crate) in_band: bool,
}

impl PodNotes {
    /// Writes the notes into the manifest of the attempt: `podNotes`, `changed` and its count.
    pub(crate) fn record_in(self, manifest: &mut Manifest) {
        manifest.pod_notes = self.lines;
        manifest.changed = self.changed;
        manifest.totals.changed_members = self.changed_total;
    }
}

/// The notes of an attempt: the archive's in-band notes if it had them, else the stderr notes.
pub(crate) fn pod_notes(outcome: &DrainOutcome, stderr: PackNotes) -> PodNotes {
    let Some(notes) = outcome.in_band_notes.as_ref() else {
        return from_stderr(stderr);
    };
    if !stderr.lines.is_empty() {
        tracing::debug!(
            lines = stderr.lines.len(),
            discarded_bytes = stderr.truncated_bytes,
            "the packer's stderr (for humans: its notes came in band)"
        );
    }
    from_in_band(outcome, notes)
}

/// An older packer: its stderr lines, as kept ([`super::exec::MAX_NOTE_BYTES`]).
fn from_stderr(stderr: PackNotes) -> PodNotes {
    let mut lines = stderr.lines;
    if stderr.truncated_bytes > 0 {
        lines.push(format!(
            "... and {} more byte(s) from the packer, not kept",
            stderr.truncated_bytes
        ));
    }
    PodNotes {
        lines,
        ..PodNotes::default()
    }
}

fn from_in_band(outcome: &DrainOutcome, notes: &InBandNotes) -> PodNotes {
    let lossy = one_line;
    let mut lines: Vec<String> = notes
        .listed_unreadable
        .iter()
        .map(|n| {
            format!(
                "{UNREADABLE_NOTE}{}: {}",
                lossy(&n.path),
                lossy(n.error.as_bytes())
            )
        })
        .collect();
    let unlisted_unreadable = notes
        .unreadable
        .saturating_sub(notes.listed_unreadable.len() as u64);
    lines.extend(notes.listed_changed.iter().map(|n| {
        format!(
            "pack: {} changed while read ({}): {} byte(s) at stat time, {} read",
            lossy(&n.path),
            n.reason.as_str(),
            n.stat_size,
            n.read
        )
    }));
    lines.extend(notes.listed_skipped.iter().map(|n| {
        format!(
            "pack: skipped {} {}",
            lossy(n.kind.as_bytes()),
            lossy(&n.path)
        )
    }));
    for (count, listed, what) in [
        (
            notes.unreadable,
            notes.listed_unreadable.len(),
            "unreadable entries",
        ),
        (notes.changed, notes.listed_changed.len(), "changed files"),
        (
            notes.skipped,
            notes.listed_skipped.len(),
            "skipped special files",
        ),
    ] {
        let more = count.saturating_sub(listed as u64);
        if more > 0 {
            lines.push(format!(
                "pack: ... and {more} more {what}, counted but not listed"
            ));
        }
    }
    let (changed, changed_total) = changed_records(outcome, notes);
    PodNotes {
        lines,
        unlisted_unreadable,
        changed,
        changed_total,
        in_band: true,
    }
}

/// `bytes` as one line of a note: lossy UTF-8, a control character (a newline in a name) escaped.
fn one_line(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for c in String::from_utf8_lossy(bytes).chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The changed files that are stored members (a changed file dropped or rejected is not in the
/// archive), and how many changed files there are: those, plus the ones counted but not listed.
fn changed_records(outcome: &DrainOutcome, notes: &InBandNotes) -> (Vec<ChangedRecord>, u64) {
    if notes.listed_changed.is_empty() {
        return (Vec::new(), notes.changed);
    }
    let stored: HashSet<&str> = outcome
        .members
        .iter()
        .filter(|m| m.kind == MemberKind::File)
        .map(|m| m.path.as_str())
        .collect();
    let records: Vec<ChangedRecord> = notes
        .listed_changed
        .iter()
        .filter_map(|n| {
            let path = std::str::from_utf8(&n.path).ok()?;
            stored.get(path).map(|_| ChangedRecord {
                path: path.to_string(),
                reason: n.reason.as_str().to_string(),
                stat_size: n.stat_size,
                read_size: n.read,
            })
        })
        .collect();
    let unlisted = notes
        .changed
        .saturating_sub(notes.listed_changed.len() as u64);
    let total = (records.len() as u64).saturating_add(unlisted);
    (records, total)
}

#[cfg(test)]
mod tests {
    use std::io::{self, Write};
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::api::{Compression, ReadBackPhase, ReadBackStatus};
    use crate::drain::archive::{drain_stream, DrainOptions};
    use crate::drain::exec::{collect_notes, MAX_NOTE_BYTES};
    use crate::drain::path_drain::{committed_status, nothing_readable};
    use crate::identity::RunId;
    use crate::inpod::pack::pack_with_opener;
    use crate::inpod::walk::{self, At};
    use crate::store::{object_keys, ManifestContext};

    async fn drain(archive: &[u8]) -> DrainOutcome {
        let opts = DrainOptions::new(1 << 30, Compression::None);
        drain_stream(archive, tokio::io::sink(), &opts)
            .await
            .expect("drain")
    }

    /// docs/contract.md, "The packer's notes travel in-band": 10,000 FIFOs with long names fill
    /// the 64 KiB of stderr the operator keeps, and push the one unreadable file's note (sorted
    /// after them) out of it. The path still fails with that file named, never ends Empty.
    #[tokio::test]
    async fn a_flood_of_fifo_names_never_turns_an_unreadable_file_into_an_empty_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..10_000 {
            let name = format!("fifo-{i:05}-{}", "n".repeat(200));
            rustix::fs::mknodat(
                rustix::fs::CWD,
                dir.path().join(name),
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .expect("mkfifo");
        }
        std::fs::write(dir.path().join("secret.txt"), b"private").expect("write");
        // Unreadable even when the test runs as root.
        let deny = |at: At<'_>, rel: &Path| {
            if rel.ends_with("secret.txt") {
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            } else {
                walk::open_file_at(at)
            }
        };
        let (mut archive, mut stderr) = (Vec::new(), Vec::new());
        pack_with_opener(dir.path(), None, &mut archive, &mut stderr, &deny).expect("pack");
        assert!(stderr.len() > 2 * MAX_NOTE_BYTES, "the flood is real");
        let kept = collect_notes(&stderr[..], MAX_NOTE_BYTES).await;
        assert!(
            !kept.lines.iter().any(|l| l.contains("secret.txt")),
            "stderr alone lost the note"
        );

        let outcome = drain(&archive).await;
        assert_eq!(
            outcome.phase(),
            ReadBackPhase::Empty,
            "what the stream alone says"
        );
        let notes = pod_notes(&outcome, kept);
        let message = nothing_readable(&outcome, &notes.lines, notes.unlisted_unreadable)
            .expect("Failed with the unreadable file, not Empty");
        assert!(notes.in_band);
        assert!(message.contains("secret.txt"), "{message}");
        assert!(message.contains("1 unreadable entry"), "{message}");
        assert!(
            notes
                .lines
                .iter()
                .any(|l| l.contains("more skipped special files")),
            "the FIFOs are counted: {:?}",
            notes.lines.last()
        );
    }

    #[tokio::test]
    async fn the_notes_marker_ends_the_archive_and_is_never_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("result.txt"), b"42").expect("write");
        let _sock =
            std::os::unix::net::UnixListener::bind(dir.path().join("s.sock")).expect("bind");
        let mut archive = Vec::new();
        crate::inpod::pack::pack(dir.path(), None, &mut archive, io::sink()).expect("pack");
        let opts = DrainOptions::new(1 << 20, Compression::None);
        let mut stored = Vec::new();
        let outcome = drain_stream(&archive[..], &mut stored, &opts)
            .await
            .expect("drain");
        let paths: Vec<String> = outcome.members.iter().map(|m| m.path.clone()).collect();
        assert_eq!(paths, ["result.txt"]);
        assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
        let mut ar = tar::Archive::new(&stored[..]);
        let names: Vec<String> = ar
            .entries()
            .expect("entries")
            .map(|e| String::from_utf8_lossy(&e.expect("entry").path_bytes()).into_owned())
            .collect();
        assert_eq!(
            names,
            ["result.txt"],
            "the marker is not in the stored archive"
        );
        let notes = outcome.in_band_notes.clone().expect("in-band notes");
        assert_eq!((notes.skipped, notes.unreadable, notes.changed), (1, 0, 0));
        assert_eq!(notes.listed_skipped[0].path, b"s.sock");
        assert_eq!(
            pod_notes(&outcome, PackNotes::default()).lines,
            ["pack: skipped socket s.sock"]
        );
    }

    #[test]
    fn a_name_with_a_newline_is_one_escaped_note() {
        let mut in_band = InBandNotes::default();
        in_band.push_unreadable(b"a\nNOTE forged", "denied");
        let outcome = DrainOutcome {
            in_band_notes: Some(in_band),
            ..Default::default()
        };
        let notes = pod_notes(&outcome, PackNotes::default());
        assert_eq!(notes.lines, ["pack: unreadable a\\nNOTE forged: denied"]);
    }

    #[tokio::test]
    async fn an_older_packer_without_in_band_notes_is_read_from_stderr_as_before() {
        let outcome = DrainOutcome::default();
        let stderr = PackNotes {
            lines: vec!["pack: unreadable secret.txt: Permission denied".to_string()],
            truncated_bytes: 7,
        };
        let notes = pod_notes(&outcome, stderr);
        assert!(!notes.in_band);
        assert_eq!(
            notes.lines,
            [
                "pack: unreadable secret.txt: Permission denied",
                "... and 7 more byte(s) from the packer, not kept"
            ]
        );
        assert!(nothing_readable(&outcome, &notes.lines, notes.unlisted_unreadable).is_some());
    }

    /// The workload's file changes while the packer reads it: the archive writer truncates it
    /// (or appends to it) once `at` bytes of the archive were written.
    struct WhileWriting {
        archive: Vec<u8>,
        file: PathBuf,
        at: usize,
        change: fn(&Path),
        done: bool,
    }

    impl Write for WhileWriting {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.archive.extend_from_slice(data);
            if !self.done && self.archive.len() >= self.at {
                (self.change)(&self.file);
                self.done = true;
            }
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Packs `dir` while `change` happens to `dir/log` mid-read, and drains it to a status.
    async fn pack_while_writing(dir: &Path, change: fn(&Path)) -> (Manifest, ReadBackStatus) {
        let mut out = WhileWriting {
            archive: Vec::new(),
            file: dir.join("log"),
            at: 64 * 1024,
            change,
            done: false,
        };
        let open = |at: At<'_>, _: &Path| walk::open_file_at(at);
        pack_with_opener(dir, None, &mut out, io::sink(), &open).expect("pack");
        assert!(out.done);
        let outcome = drain(&out.archive).await;
        let notes = pod_notes(&outcome, PackNotes::default());
        let run = RunId {
            namespace: "ns".into(),
            name: "r".into(),
            uid: "u".into(),
        };
        let prefix = object_store::path::Path::from("p");
        let keys = object_keys(&prefix, &run, 0, "/out", Compression::None);
        let ctx = ManifestContext {
            run,
            declared_path: "/out".into(),
            index: 0,
            attempt: 1,
        };
        let now = jiff::Timestamp::now();
        let opts = DrainOptions::new(1 << 30, Compression::None);
        let mut manifest = Manifest::from_outcome(&ctx, &keys, opts.stored(), outcome, now, now);
        notes.record_in(&mut manifest);
        let status = committed_status("/out", &manifest, &keys, "file:///s", 1);
        (manifest, status)
    }

    /// docs/contract.md, "A changed file is never stored as a clean one": a log the workload is
    /// still writing when the packer reads it is recorded as changed — in the manifest (reason,
    /// stat and read sizes), in the status count and message, and as a Warning Event.
    #[tokio::test]
    async fn a_file_that_shrinks_or_grows_while_packed_is_recorded_as_changed_never_clean() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("log"), vec![b'x'; 1 << 20]).expect("write");
        std::fs::write(dir.path().join("result.txt"), b"42\n").expect("write");
        let truncate = |p: &Path| std::fs::write(p, b"").expect("truncate");
        let (manifest, status) = pack_while_writing(dir.path(), truncate).await;
        assert_eq!(manifest.changed.len(), 1, "{:?}", manifest.changed);
        let c = &manifest.changed[0];
        assert_eq!((c.path.as_str(), c.reason.as_str()), ("log", "shrunk"));
        assert_eq!(c.stat_size, 1 << 20);
        assert!(c.read_size < c.stat_size, "{c:?}");
        assert_eq!(manifest.totals.changed_members, 1);
        assert_eq!(status.changed_members, 1);
        let message = status.message.clone().unwrap_or_default();
        assert!(
            message.contains("1 stored file(s) changed while the packer read them"),
            "{message}"
        );
        let summary = crate::controller::events::drain_summary(&[status]).expect("summary");
        assert!(summary.warning, "{summary:?}");
        assert_eq!(summary.reason, crate::controller::events::READ_BACK_CHANGED);
        assert!(
            summary.note.contains("1 member(s) changed while read"),
            "{}",
            summary.note
        );

        std::fs::write(dir.path().join("log"), vec![b'x'; 1 << 20]).expect("write");
        let append = |p: &Path| {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(p)
                .expect("open");
            f.write_all(b"more").expect("append");
        };
        let (manifest, _) = pack_while_writing(dir.path(), append).await;
        assert_eq!(manifest.changed.len(), 1);
        assert_eq!(manifest.changed[0].reason, "grew");
    }
}
