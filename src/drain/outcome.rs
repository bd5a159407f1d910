//! The status entry a path's drain ends with, pure: a committed manifest's
//! ([`committed_status`], the object URLs it names), a path where nothing could be read
//! ([`nothing_readable`]: unreadable is not Empty, ADR-143 §4), a failure ([`failed`]) and a path
//! whose run's store cannot be used ([`store_unusable`]).

use crate::api::{ReadBackPhase, ReadBackStatus};
use crate::store::{DrainOutcome, Manifest, ObjectKeys, ObjectUrl};
use crate::tar::sanitize::MemberKind;

/// The status entry of a committed manifest.
pub(crate) fn committed_status(
    path: &str,
    manifest: &Manifest,
    keys: &ObjectKeys,
    store_url: &str,
    attempts: u32,
) -> ReadBackStatus {
    let phase = manifest.phase;
    let message = match phase {
        ReadBackPhase::Empty if !manifest.pod_notes.is_empty() => Some(format!(
            "nothing was stored; the packer reported {} note(s), listed in the manifest's podNotes: {}",
            manifest.pod_notes.len(),
            manifest.pod_notes.first().map(String::as_str).unwrap_or_default()
        )),
        ReadBackPhase::Empty => Some("the workload wrote nothing at this path".to_string()),
        ReadBackPhase::Capped => Some(capped_message(manifest)),
        _ if manifest.totals.rejected_members > 0 => Some(format!(
            "{} unsafe member(s) rejected, listed in the manifest",
            manifest.totals.rejected_members
        )),
        _ if !manifest.pod_notes.is_empty() => Some(format!(
            "the packer reported {} problem(s) in the pod (unreadable or special files), listed in the manifest's podNotes: {}",
            manifest.pod_notes.len(),
            manifest.pod_notes.first().map(String::as_str).unwrap_or_default()
        )),
        _ => None,
    };
    let message = with_changed(message, manifest.totals.changed_members);
    ReadBackStatus {
        path: path.to_string(),
        phase,
        bytes: manifest.totals.bytes,
        members: manifest.totals.members,
        dropped_members: manifest.totals.dropped_members,
        rejected_members: manifest.totals.rejected_members,
        changed_members: manifest.totals.changed_members,
        object: Some(ObjectUrl::of(store_url, &keys.archive).into_string()),
        manifest: Some(ObjectUrl::of(store_url, &keys.manifest).into_string()),
        attempts,
        message,
    }
}

/// A path with changed members says so first, whatever else its message says (docs/contract.md,
/// "A changed file is never stored as a clean one").
fn with_changed(message: Option<String>, changed: u64) -> Option<String> {
    if changed == 0 {
        return message;
    }
    let head = format!(
        "{changed} stored file(s) changed while the packer read them (zero-padded or cut at their listed size), listed in the manifest's changed"
    );
    Some(match message {
        Some(rest) => format!("{head}; {rest}"),
        None => head,
    })
}

/// The status message of a Capped path: what was dropped, and whether the input bound cut the
/// stream.
fn capped_message(manifest: &Manifest) -> String {
    let mut text = format!(
        "cap of {} bytes reached: {} member(s) ({} bytes) dropped, listed in the manifest",
        manifest.cap_bytes, manifest.totals.dropped_members, manifest.totals.dropped_bytes
    );
    if let Some(bound) = manifest.stopped_at_input_bound {
        text.push_str(&format!(
            "; the stream reached the drain's input bound of {bound} bytes and was not read further: the {} member(s) read before it are kept",
            manifest.totals.members
        ));
    }
    text
}

/// Unreadable is not Empty (ADR-143 §4, docs/contract.md): a path that stored no file or symlink
/// (directories alone are no content), dropped and rejected nothing, and whose packer reported
/// unreadable entries, did not drain an empty set — the workload's files could not be read.
/// Returns the failure message, with the packer's first notes, or None when the outcome stands.
pub(crate) fn nothing_readable(
    outcome: &DrainOutcome,
    notes: &[String],
    unlisted: u64,
) -> Option<String> {
    let stored_content = outcome.members.iter().any(|m| m.kind != MemberKind::Dir);
    if stored_content
        || outcome.dropped_count() > 0
        || outcome.rejected_count() > 0
        || outcome.stopped_at_input_bound.is_some()
    {
        return None;
    }
    let unreadable: Vec<&str> = notes
        .iter()
        .map(String::as_str)
        .filter(|l| l.starts_with(crate::inpod::pack::UNREADABLE_NOTE))
        .collect();
    let total = (unreadable.len() as u64).saturating_add(unlisted);
    if total == 0 {
        return None;
    }
    const SHOWN: usize = 3;
    const NOTE_LIMIT: usize = 300;
    let shown: Vec<&str> = unreadable
        .iter()
        .take(SHOWN)
        .map(|note| crate::text::prefix(note, NOTE_LIMIT))
        .collect();
    let more = if total > shown.len() as u64 {
        format!(" (and {} more)", total - shown.len() as u64)
    } else {
        String::new()
    };
    Some(format!(
        "nothing at this path could be read: the packer stored no file and reported {total} unreadable entr{}: {}{more}",
        if total == 1 { "y" } else { "ies" },
        shown.join("; ")
    ))
}

/// The outcome of a path whose run's store cannot be used (`why` names it): Failed, counted as
/// such, nothing read from the pod.
pub(crate) fn store_unusable(path: &str, attempts: u32, why: &str) -> ReadBackStatus {
    failed(path, attempts, format!("not drained: {why}"))
}

pub(crate) fn failed(path: &str, attempts: u32, message: String) -> ReadBackStatus {
    ReadBackStatus {
        path: path.to_string(),
        phase: ReadBackPhase::Failed,
        attempts,
        message: Some(message),
        ..ReadBackStatus::default()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::api::Compression;
    use crate::drain::attempt_error::AttemptError;
    use crate::drain::DrainOptions;
    use crate::identity::RunId;
    use crate::store::{object_keys, DroppedRecord, ManifestContext, MemberRecord, RejectedRecord};
    use crate::tar::sanitize::Reason;

    #[test]
    fn object_urls_keep_scheme_and_bucket() {
        let key = object_store::path::Path::from("runs/ns/a/u/00-out.tar");
        assert_eq!(
            ObjectUrl::of("s3://bucket/runs", &key).into_string(),
            "s3://bucket/runs/ns/a/u/00-out.tar"
        );
        assert_eq!(
            ObjectUrl::of("file:///var/lib/store", &key).into_string(),
            "file:///var/lib/store/runs/ns/a/u/00-out.tar"
        );
    }

    pub(in crate::drain) fn member(path: &str, kind: MemberKind) -> MemberRecord {
        MemberRecord {
            path: path.into(),
            kind,
            size: 0,
            sha256: None,
            mode: 0o755,
            link_target: None,
            superseded: false,
        }
    }

    #[test]
    fn a_path_whose_only_entries_were_unreadable_fails_with_the_notes_never_empty() {
        let notes = vec![
            "pack: skipped fifo pipe".to_string(),
            "pack: unreadable secret.txt: Permission denied (os error 13)".to_string(),
            "pack: unreadable private: IO error for operation on /out/private: Permission denied (os error 13)".to_string(),
        ];
        // Nothing stored at all.
        let empty = DrainOutcome::default();
        assert_eq!(
            empty.phase(),
            ReadBackPhase::Empty,
            "what the stream alone says"
        );
        let message = nothing_readable(&empty, &notes, 0).expect("a failure, not Empty");
        assert!(message.contains("2 unreadable entries"), "{message}");
        assert!(
            message.contains("pack: unreadable secret.txt: Permission denied"),
            "{message}"
        );
        assert!(message.contains("pack: unreadable private"), "{message}");
        // Directories alone are no content: still a failure.
        let dirs_only = DrainOutcome {
            members: vec![member("private", MemberKind::Dir)],
            ..Default::default()
        };
        assert!(nothing_readable(&dirs_only, &notes, 0).is_some());
        // It is a final failure, labelled for the metric.
        let err = AttemptError::NothingReadable(message.clone());
        assert!(!err.is_transient());
        assert_eq!(err.metric_label(), "unreadable");
        assert_eq!(err.to_string(), message);
    }

    #[test]
    fn unreadable_notes_beside_stored_files_or_no_unreadable_note_change_nothing() {
        let unreadable = vec!["pack: unreadable secret.txt: Permission denied".to_string()];
        let with_file = DrainOutcome {
            members: vec![member("report.txt", MemberKind::File)],
            ..Default::default()
        };
        assert_eq!(nothing_readable(&with_file, &unreadable, 0), None);
        let with_link = DrainOutcome {
            members: vec![member("l", MemberKind::Symlink)],
            ..Default::default()
        };
        assert_eq!(nothing_readable(&with_link, &unreadable, 0), None);
        let capped = DrainOutcome {
            dropped: vec![DroppedRecord {
                path: "big".into(),
                size: 9,
                reason: "over_cap".into(),
                in_pod: true,
            }],
            ..Default::default()
        };
        assert_eq!(nothing_readable(&capped, &unreadable, 0), None);
        let rejected = DrainOutcome {
            rejected: vec![RejectedRecord {
                path: "/etc/x".into(),
                entry_type: "0".into(),
                size: 1,
                reason: Reason::AbsolutePath,
            }],
            ..Default::default()
        };
        assert_eq!(nothing_readable(&rejected, &unreadable, 0), None);
        // Empty really is empty when nothing was unreadable (a skipped socket is not content).
        let skipped = vec!["pack: skipped socket s.sock".to_string()];
        assert_eq!(
            nothing_readable(&DrainOutcome::default(), &skipped, 0),
            None
        );
        assert_eq!(nothing_readable(&DrainOutcome::default(), &[], 0), None);
    }

    #[test]
    fn many_unreadable_notes_are_summarized() {
        let notes: Vec<String> = (0..10)
            .map(|i| format!("pack: unreadable f{i}: {}", "x".repeat(1000)))
            .collect();
        let message = nothing_readable(&DrainOutcome::default(), &notes, 0).expect("failure");
        assert!(message.contains("10 unreadable entries"), "{message}");
        assert!(message.contains("(and 7 more)"), "{message}");
        assert!(message.len() < 1200, "{}", message.len());
    }

    #[test]
    fn a_capped_message_says_when_the_input_bound_cut_the_stream() {
        let outcome = DrainOutcome {
            members: vec![member("a.txt", MemberKind::File)],
            dropped: vec![DroppedRecord {
                path: "big.bin".into(),
                size: 1 << 36,
                reason: "over_cap".into(),
                in_pod: false,
            }],
            stopped_at_input_bound: Some(272_629_760),
            ..Default::default()
        };
        let run = RunId {
            namespace: "ns".into(),
            name: "r".into(),
            uid: "u".into(),
        };
        let keys = object_keys(
            &object_store::path::Path::from("p"),
            &run,
            0,
            "/out",
            Compression::None,
        );
        let ctx = ManifestContext {
            run,
            declared_path: "/out".into(),
            index: 0,
            attempt: 1,
        };
        let now = jiff::Timestamp::now();
        let opts = DrainOptions::new(1 << 20, Compression::None);
        let manifest = Manifest::new(&ctx, &keys, opts.stored(), &outcome, now, now);
        let status = committed_status("/out", &manifest, &keys, "file:///s", 1);
        assert_eq!(status.phase, ReadBackPhase::Capped);
        let message = status.message.unwrap_or_default();
        assert!(message.contains("1 member(s)"), "{message}");
        assert!(
            message.contains("input bound of 272629760 bytes and was not read further"),
            "{message}"
        );
        assert!(
            message.contains("the 1 member(s) read before it are kept"),
            "{message}"
        );
    }
}
