//! Deleting what one run stored, for `spec.readBack.retention: Delete` (docs/contract.md
//! "Stored files when a run is deleted"). Only ever under [`run_dir`] of the run: the keys of
//! another run — a name that merely starts with this one's (`a` / `ab`), or an earlier run of the
//! same name (another uid) — are never listed, let alone deleted.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::error::StoreError;
use super::keys::run_dir;
use crate::identity::RunId;

/// The longest one purge call works (docs/contract.md "Stored files when a run is deleted"):
/// the tenant writes its own store, so the number of keys under a run is its to choose (100,000
/// junk keys took ~330 s one delete at a time); past this the call reports itself unfinished and
/// the finalizer's retry goes on from where it stopped, within the delete's retry bound.
pub(crate) const PURGE_BUDGET: Duration = Duration::from_secs(10);

/// Why a run's stored files could not be deleted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PurgeError {
    /// A run reference with an empty part would widen the prefix to other runs' keys.
    #[error("refusing to delete stored files of a run with an empty {0}")]
    Incomplete(&'static str),
    /// The store refused a listing or a delete.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The budget ran out with keys left (more than a purge deletes in [`PURGE_BUDGET`]).
    #[error("deleted {deleted} objects in {}s and more are left under the run's directory; the next attempt goes on", budget.as_secs())]
    Unfinished {
        /// Objects deleted by this call.
        deleted: usize,
        /// The budget that ran out.
        budget: Duration,
    },
}

/// Deletes every object stored for `run` (this namespace, name and uid), its `manifests` first
/// (the keys of its declared paths' manifests: [`super::keys::object_keys`]) so that a delete cut
/// short never leaves a manifest whose archive is gone (a manifest is the commit point: present
/// means the archive is complete), within [`PURGE_BUDGET`]. Returns how many objects were
/// deleted; an object that vanished meanwhile is not counted and not an error. Idempotent.
pub(crate) async fn delete_run_archives(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    run: &RunId,
    manifests: &[Path],
) -> Result<usize, PurgeError> {
    delete_run_archives_within(store, prefix, run, manifests, PURGE_BUDGET).await
}

/// [`delete_run_archives`] within `budget`. The manifests are deleted by their known keys (not
/// found in a listing first: the directory holds what the tenant wrote, and a listing of 100,000
/// keys is slow); then the listing is streamed and its keys deleted in the store's batches as they
/// come (`delete_stream`: S3's DeleteObjects, 1,000 a request), so neither memory nor the number
/// of requests grows with the keys a tenant wrote (issue #38), and each call makes progress.
pub(crate) async fn delete_run_archives_within(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    run: &RunId,
    manifests: &[Path],
    budget: Duration,
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
    let deadline = tokio::time::Instant::now() + budget;
    // Only keys under the run's own directory, whatever the caller passed.
    let own: Vec<Path> = manifests
        .iter()
        .filter(|k| k.prefix_matches(&dir) && **k != dir)
        .cloned()
        .collect();
    let mut deleted = 0;
    for pass in 0..2 {
        // The listing is made after the manifests are gone (a store may list at the call).
        let keys = match pass {
            0 => existing(store, own.clone()),
            _ => listed(store, &dir),
        };
        match delete_all(store, keys, deadline).await {
            Ok(count) => deleted += count,
            Err(Pass::Unfinished(count)) => {
                return Err(PurgeError::Unfinished {
                    deleted: deleted + count,
                    budget,
                })
            }
            Err(Pass::Store(source)) => {
                return Err(StoreError::Object {
                    op: "deleting under",
                    key: dir.to_string(),
                    source,
                }
                .into())
            }
        }
    }
    Ok(deleted)
}

/// Those of `keys` the store has (a batch delete reports a key that is not there as deleted).
fn existing(
    store: &Arc<dyn ObjectStore>,
    keys: Vec<Path>,
) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
    let store = Arc::clone(store);
    futures::stream::iter(keys)
        .filter_map(move |key| {
            let store = Arc::clone(&store);
            async move {
                match store.head(&key).await {
                    Ok(_) => Some(Ok(key)),
                    Err(object_store::Error::NotFound { .. }) => None,
                    Err(e) => Some(Err(e)),
                }
            }
        })
        .boxed()
}

/// Every key under `dir`, as the listing streams. object_store lists by path segments already;
/// checked again here because a store that matched raw string prefixes would hand back another
/// run's keys.
fn listed(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
    let under = dir.clone();
    store
        .list(Some(dir))
        .try_filter_map(move |meta| {
            let key = meta.location;
            let ours = key.prefix_matches(&under) && key != under;
            std::future::ready(Ok(ours.then_some(key)))
        })
        .boxed()
}

/// How one pass over the run's directory stopped short.
enum Pass {
    /// The deadline came first, after this many deletes.
    Unfinished(usize),
    /// The store refused the listing or a delete.
    Store(object_store::Error),
}

/// Deletes `keys` as they come, until the deadline.
async fn delete_all(
    store: &Arc<dyn ObjectStore>,
    keys: futures::stream::BoxStream<'static, object_store::Result<Path>>,
    deadline: tokio::time::Instant,
) -> Result<usize, Pass> {
    let mut results = store.delete_stream(keys);
    let mut deleted = 0;
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(Pass::Unfinished(deleted));
        }
        match tokio::time::timeout_at(deadline, results.next()).await {
            Err(_) => return Err(Pass::Unfinished(deleted)),
            Ok(None) => return Ok(deleted),
            Ok(Some(Ok(_))) => deleted += 1,
            Ok(Some(Err(object_store::Error::NotFound { .. }))) => {}
            Ok(Some(Err(source))) => return Err(Pass::Store(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Compression;
    use crate::store::object_keys;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn run(name: &str, uid: &str) -> RunId {
        RunId {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// The manifest keys of [`put_paths`]' two paths.
    fn manifests(prefix: &Path, run: &RunId) -> Vec<Path> {
        ["/work/out", "/logs"]
            .iter()
            .enumerate()
            .map(|(i, p)| crate::store::keys::manifest_key(prefix, run, i, p))
            .collect()
    }

    async fn put_paths(store: &Arc<dyn ObjectStore>, prefix: &Path, run: &RunId) -> Vec<Path> {
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
                &RunId {
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

        assert_eq!(
            delete_run_archives(&store, &prefix, &a, &manifests(&prefix, &a))
                .await
                .unwrap(),
            4
        );
        let mut want: Vec<String> = kept.iter().map(|k| k.to_string()).collect();
        want.sort();
        assert_eq!(all(&store).await, want);
        // Idempotent: nothing left to delete is not an error.
        assert_eq!(
            delete_run_archives(&store, &prefix, &a, &manifests(&prefix, &a))
                .await
                .unwrap(),
            0
        );
        assert_eq!(all(&store).await, want);
    }

    /// Issue #38: 100,000 junk keys a tenant wrote under its run were deleted one request at a
    /// time (~300/s, over 300 s in one finalizer call). The purge streams the listing into the
    /// store's batch delete and stops at its budget with what is left reported, never holding a
    /// reconcile for longer; the next call goes on. Manifests go first.
    #[tokio::test]
    async fn a_tenants_litter_is_deleted_in_batches_and_a_call_stops_at_its_budget() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("drains");
        let a = run("a", "u1");
        let own = put_paths(&store, &prefix, &a).await;
        let dir = run_dir(&prefix, &a);
        for i in 0..3_000 {
            let key = dir.clone().join(format!("junk-{i}").as_str());
            store
                .put(&key, PutPayload::from_static(b"j"))
                .await
                .unwrap();
        }
        // A zero budget deletes nothing and says so.
        let cut = delete_run_archives_within(
            &store,
            &prefix,
            &a,
            &manifests(&prefix, &a),
            Duration::ZERO,
        )
        .await;
        assert!(
            matches!(cut, Err(PurgeError::Unfinished { deleted: 0, .. })),
            "{cut:?}"
        );
        let deleted = delete_run_archives(&store, &prefix, &a, &manifests(&prefix, &a))
            .await
            .unwrap();
        assert_eq!(deleted, 3_000 + own.len());
        assert!(all(&store).await.is_empty());
    }

    #[tokio::test]
    async fn an_empty_part_of_the_run_is_refused_rather_than_widening_the_prefix() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("drains");
        let keys = put_paths(&store, &prefix, &run("a", "u1")).await;
        for bad in [run("a", ""), run("", "u1")] {
            let err = delete_run_archives(&store, &prefix, &bad, &[]).await;
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
        assert_eq!(
            delete_run_archives(&store, &prefix, &a, &manifests(&prefix, &a))
                .await
                .unwrap(),
            4
        );
        assert_eq!(all(&store).await.len(), kept.len());
    }
}
