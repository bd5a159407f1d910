//! Deleting what one run stored, for `spec.readBack.retention: Delete` (docs/contract.md
//! "Stored files when a run is deleted"). Only ever under [`run_dir`] of the run: the keys of
//! another run — a name that merely starts with this one's (`a` / `ab`), or an earlier run of the
//! same name (another uid) — are never listed, let alone deleted.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::error::StoreError;
use super::keys::{run_dir, RunRef, MANIFEST_SUFFIX};

/// Why a run's stored files could not be deleted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PurgeError {
    /// A run reference with an empty part would widen the prefix to other runs' keys.
    #[error("refusing to delete stored files of a run with an empty {0}")]
    Incomplete(&'static str),
    /// The store refused a listing or a delete.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Deletes every object stored for `run` (this namespace, name and uid), manifests first so that
/// a delete cut short never leaves a manifest whose archive is gone (a manifest is the commit
/// point: present means the archive is complete). Returns how many objects were deleted; an
/// object that vanished meanwhile is not counted and not an error. Idempotent.
pub(crate) async fn delete_run_archives(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    run: &RunRef,
) -> Result<usize, PurgeError> {
    for (part, value) in [
        ("namespace", &run.namespace),
        ("name", &run.name),
        ("uid", &run.uid),
    ] {
        if value.is_empty() {
            return Err(PurgeError::Incomplete(part));
        }
    }
    let dir = run_dir(prefix, run);
    // object_store lists by path segments already; checked again here because a store that
    // matched raw string prefixes would hand back another run's keys.
    let mut keys: Vec<Path> = super::keys::list_keys(store, &dir)
        .await?
        .into_iter()
        .filter(|k| k.prefix_matches(&dir) && *k != dir)
        .collect();
    keys.sort_by_key(|k| {
        (
            !k.filename().is_some_and(|f| f.ends_with(MANIFEST_SUFFIX)),
            k.to_string(),
        )
    });
    let mut deleted = 0;
    for key in keys {
        match store.delete(&key).await {
            Ok(()) => deleted += 1,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(StoreError::Object {
                    op: "deleting",
                    key: key.to_string(),
                    source,
                }
                .into())
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Compression;
    use crate::store::object_keys;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn run(name: &str, uid: &str) -> RunRef {
        RunRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    async fn put_paths(store: &Arc<dyn ObjectStore>, prefix: &Path, run: &RunRef) -> Vec<Path> {
        let mut keys = Vec::new();
        for (i, p) in ["/work/out", "/logs"].iter().enumerate() {
            let k = object_keys(prefix, run, i, p, Compression::Gzip);
            for key in [k.archive, k.manifest] {
                store
                    .put(&key, PutPayload::from_static(b"x"))
                    .await
                    .unwrap();
                keys.push(key);
            }
        }
        keys
    }

    async fn all(store: &Arc<dyn ObjectStore>) -> Vec<String> {
        let mut v: Vec<String> = store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_run_deletes_its_own_keys_and_never_those_of_a_longer_name_or_another_uid() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("drains");
        let a = run("a", "u1");
        put_paths(&store, &prefix, &a).await;
        let mut kept = Vec::new();
        // `ab` starts with `a`; `a` with uid `u12` is a later run of the same name whose uid starts
        // with this one's; a different namespace `nsx` starts with `ns`.
        kept.extend(put_paths(&store, &prefix, &run("ab", "u1")).await);
        kept.extend(put_paths(&store, &prefix, &run("a", "u12")).await);
        kept.extend(
            put_paths(
                &store,
                &prefix,
                &RunRef {
                    namespace: "nsx".into(),
                    ..a.clone()
                },
            )
            .await,
        );
        // A key that shares the raw string prefix `drains/ns/a/u1` without being under it.
        let lookalike = Path::from("drains/ns/a/u1x/00-out.tar");
        store
            .put(&lookalike, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        kept.push(lookalike);

        assert_eq!(delete_run_archives(&store, &prefix, &a).await.unwrap(), 4);
        let mut want: Vec<String> = kept.iter().map(|k| k.to_string()).collect();
        want.sort();
        assert_eq!(all(&store).await, want);
        // Idempotent: nothing left to delete is not an error.
        assert_eq!(delete_run_archives(&store, &prefix, &a).await.unwrap(), 0);
        assert_eq!(all(&store).await, want);
    }

    #[tokio::test]
    async fn an_empty_part_of_the_run_is_refused_rather_than_widening_the_prefix() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("drains");
        let keys = put_paths(&store, &prefix, &run("a", "u1")).await;
        for bad in [run("a", ""), run("", "u1")] {
            let err = delete_run_archives(&store, &prefix, &bad).await;
            assert!(matches!(err, Err(PurgeError::Incomplete(_))), "{err:?}");
        }
        assert_eq!(all(&store).await.len(), keys.len());
    }

    #[tokio::test]
    async fn a_file_store_is_purged_under_the_run_dir_only() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let (store, prefix) = crate::store::store_from_url(&url, &[]).unwrap();
        let a = run("a", "u1");
        put_paths(&store, &prefix, &a).await;
        let kept = put_paths(&store, &prefix, &run("ab", "u1")).await;
        assert_eq!(delete_run_archives(&store, &prefix, &a).await.unwrap(), 4);
        assert_eq!(all(&store).await.len(), kept.len());
    }
}
