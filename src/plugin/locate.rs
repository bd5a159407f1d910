//! Where a run's drained files are, from its own status: each `status.readBack[].object` is the
//! URL of an archive at `<store URL>/<namespace>/<name>/<uid>/<index>-<slug>.<ext>` (the key
//! layout of docs/contract.md §3, `store::keys`), so the store URL and the run instance are the
//! URL without its last four segments and the third-from-last one.

use kube::ResourceExt;
use thiserror::Error;

use crate::api::{ReadBackPhase, SandboxRun};

/// A run's store and instance, as its status names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The store URL the operator drained into (its `--store-url`, as far as the object URL
    /// keeps it: scheme, bucket and prefix).
    pub store_url: String,
    /// The uid of the run instance whose files these are.
    pub uid: String,
}

/// Why the status does not say where the files are.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LocateError {
    /// No path has a stored object (yet).
    #[error("{run} has no stored object in status.readBack ({state}); pass --store-url to read a store directly")]
    NothingStored {
        /// `namespace/name`.
        run: String,
        /// The phase and each path's phase (and a failed drain's message).
        state: String,
    },
    /// An object URL is not of the documented layout, or names another run.
    #[error("{run}: status.readBack[].object {object:?} is not <store>/{run}/<uid>/<file>; pass --store-url")]
    Layout {
        /// `namespace/name`.
        run: String,
        /// The URL.
        object: String,
    },
    /// Two paths name different stores or instances.
    #[error("{run}: status.readBack names two stores or instances ({a} and {b}); pass --store-url and --uid")]
    Disagree {
        /// `namespace/name`.
        run: String,
        /// One.
        a: String,
        /// The other.
        b: String,
    },
}

/// The store and instance of `object`, an archive URL of the run `namespace/name`, of any of
/// its attempts ([`crate::store::ObjectUrl::parse`], the type that rendered it).
pub fn store_of_object(object: &str, namespace: &str, name: &str) -> Option<Located> {
    let found = crate::store::ObjectUrl::parse(object, namespace, name)?;
    Some(Located {
        store_url: found.store_url,
        uid: found.uid,
    })
}

/// Where the files of `run` are, from its `status.readBack[].object`s.
pub fn store_of_run(run: &SandboxRun) -> Result<Located, LocateError> {
    let namespace = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let label = format!("{namespace}/{name}");
    let entries = run
        .status
        .as_ref()
        .map(|s| s.read_back.as_slice())
        .unwrap_or_default();
    let mut found: Option<Located> = None;
    for object in entries.iter().filter_map(|e| e.object.as_deref()) {
        let here =
            store_of_object(object, &namespace, &name).ok_or_else(|| LocateError::Layout {
                run: label.clone(),
                object: object.to_string(),
            })?;
        match &found {
            Some(first) if *first != here => {
                return Err(LocateError::Disagree {
                    run: label,
                    a: format!("{} uid {}", first.store_url, first.uid),
                    b: format!("{} uid {}", here.store_url, here.uid),
                })
            }
            Some(_) => {}
            None => found = Some(here),
        }
    }
    found.ok_or_else(|| LocateError::NothingStored {
        state: state_words(run),
        run: label,
    })
}

/// The run's phase and each path's, for an error that says why nothing is stored.
fn state_words(run: &SandboxRun) -> String {
    let status = run.status.as_ref();
    let phase = status
        .and_then(|s| s.phase)
        .map(|p| p.as_str())
        .unwrap_or("no phase yet");
    let declared = run.spec.read_back_paths().len();
    let entries = status.map(|s| s.read_back.as_slice()).unwrap_or_default();
    if declared == 0 && entries.is_empty() {
        return format!("phase {phase}; it declares no read-back paths");
    }
    if entries.is_empty() {
        return format!("phase {phase}; not drained yet");
    }
    let paths: Vec<String> = entries
        .iter()
        .map(|e| match (e.phase, e.message.as_deref()) {
            (ReadBackPhase::Failed, Some(m)) => {
                format!("{} Failed: {}", e.path, crate::text::printable(m))
            }
            (phase, _) => format!("{} {}", e.path, phase.as_str()),
        })
        .collect();
    format!("phase {phase}; {}", paths.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ReadBackStatus, SandboxRunStatus};

    fn run_with(entries: Vec<ReadBackStatus>) -> SandboxRun {
        crate::testkit::sandbox_run("job")
            .namespace("ns")
            .status(SandboxRunStatus {
                phase: Some(Phase::Failed),
                read_back: entries,
                ..Default::default()
            })
            .build()
    }

    fn entry(path: &str, phase: ReadBackPhase, object: Option<&str>) -> ReadBackStatus {
        ReadBackStatus {
            path: path.into(),
            phase,
            object: object.map(str::to_string),
            message: (phase == ReadBackPhase::Failed).then(|| "exec refused".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn the_store_is_the_object_url_without_the_run_and_its_file() {
        let at = |o: &str| store_of_object(o, "ns", "job");
        assert_eq!(
            at("s3://bucket/runs/prod/ns/job/u-1/00-work-out.tar.zst"),
            Some(Located {
                store_url: "s3://bucket/runs/prod".into(),
                uid: "u-1".into()
            })
        );
        assert_eq!(
            at("s3://bucket/ns/job/u-1/00-out.tar").map(|l| l.store_url),
            Some("s3://bucket".into())
        );
        assert_eq!(
            at("file:///var/lib/sandboxrun/store/ns/job/u/01-x.tar").map(|l| l.store_url),
            Some("file:///var/lib/sandboxrun/store".into())
        );
        // Another run's object, too few segments, no scheme, no bucket.
        assert_eq!(at("s3://bucket/ns/other/u/00-out.tar"), None);
        assert_eq!(at("s3://bucket/other/job/u/00-out.tar"), None);
        assert_eq!(at("ns/job/u/00-out.tar"), None);
        assert_eq!(at("bucket/ns/job/u/00-out.tar"), None);
        assert_eq!(at("s3:///ns/job/u/00-out.tar"), None);
        assert_eq!(at("s3://bucket/ns/job//00-out.tar"), None);
    }

    #[test]
    fn a_retried_run_is_located_by_its_later_attempts_objects() {
        // A later attempt's files are under `<uid>/attempt-N/` (store::keys): the run is there.
        let object = "s3://b/p/ns/job/u1/attempt-2/00-out.tar";
        let run = run_with(vec![entry("/out", ReadBackPhase::Drained, Some(object))]);
        assert_eq!(
            store_of_run(&run),
            Ok(Located {
                store_url: "s3://b/p".into(),
                uid: "u1".into()
            })
        );
    }

    #[test]
    fn a_run_is_located_by_any_stored_path_and_failures_are_named() {
        let object = "s3://b/p/ns/job/u1/01-b.tar";
        let run = run_with(vec![
            entry("/a", ReadBackPhase::Failed, None),
            entry("/b", ReadBackPhase::Drained, Some(object)),
        ]);
        assert_eq!(
            store_of_run(&run),
            Ok(Located {
                store_url: "s3://b/p".into(),
                uid: "u1".into()
            })
        );
        let run = run_with(vec![entry("/a", ReadBackPhase::Failed, None)]);
        let err = store_of_run(&run).expect_err("nothing stored");
        let text = err.to_string();
        assert!(
            text.contains("ns/job") && text.contains("/a Failed: exec refused"),
            "{text}"
        );
        assert!(text.contains("--store-url"), "{text}");
        let run = run_with(vec![]);
        assert!(store_of_run(&run)
            .expect_err("none")
            .to_string()
            .contains("declares no read-back paths"));
    }

    #[test]
    fn two_stores_or_a_foreign_object_are_refused() {
        let run = run_with(vec![
            entry(
                "/a",
                ReadBackPhase::Drained,
                Some("s3://b/p/ns/job/u1/00-a.tar"),
            ),
            entry(
                "/b",
                ReadBackPhase::Drained,
                Some("s3://c/p/ns/job/u1/01-b.tar"),
            ),
        ]);
        assert!(matches!(
            store_of_run(&run),
            Err(LocateError::Disagree { .. })
        ));
        let run = run_with(vec![entry(
            "/a",
            ReadBackPhase::Drained,
            Some("s3://b/p/ns/someone-else/u1/00-a.tar"),
        )]);
        assert!(matches!(
            store_of_run(&run),
            Err(LocateError::Layout { .. })
        ));
    }
}
