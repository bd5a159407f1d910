//! No orphaned multipart uploads (docs/contract.md, "What the store holds across attempts").
//!
//! An archive larger than one part goes up as a multipart upload. When the attempt that owns it is
//! cancelled — its future dropped by the drain timeout, by shutdown or by a lost lease — nothing
//! awaits an abort, and the uploaded parts would stay in the bucket, billed and invisible, until a
//! lifecycle rule removes them. [`AbortingStore`] wraps the store the archive writer uploads
//! through: every multipart upload it hands out is an [`AbortOnDrop`] guard that, dropped before
//! it completed or was aborted, spawns the abort on the runtime and tracks it, so the operator can
//! wait for those aborts before it exits ([`wait_for_pending_aborts`]).
//!
//! What this cannot cover: a process killed outright (SIGKILL, OOM, node loss) runs no guard. On
//! S3 the key's next attempt lists and aborts such an upload first
//! (`crate::store::open_uploads`); otherwise the bucket's lifecycle rule (abort incomplete
//! multipart uploads after N days, docs/operations.md) is what removes it.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

/// The aborts spawned by dropped guards, awaited at shutdown.
static PENDING_ABORTS: LazyLock<TaskTracker> = LazyLock::new(TaskTracker::new);

/// Waits (at most `limit`) for the aborts that dropped uploads spawned; returns how many were still
/// running when the limit passed. Called by the operator before it exits, after its drains stopped.
pub(crate) async fn wait_for_pending_aborts(limit: Duration) -> usize {
    PENDING_ABORTS.close();
    let waited = tokio::time::timeout(limit, PENDING_ABORTS.wait()).await;
    PENDING_ABORTS.reopen();
    match waited {
        Ok(()) => 0,
        Err(_) => PENDING_ABORTS.len(),
    }
}

/// A store whose multipart uploads abort themselves when dropped unfinished. Everything else is
/// passed through unchanged.
#[derive(Debug)]
pub(crate) struct AbortingStore {
    inner: Arc<dyn ObjectStore>,
}

impl AbortingStore {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> AbortingStore {
        AbortingStore { inner }
    }
}

impl fmt::Display for AbortingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AbortingStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for AbortingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(AbortOnDrop {
            upload: Some(upload),
            location: location.clone(),
            settled: false,
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload that, dropped before `complete` or `abort` returned, aborts itself in a
/// spawned task (Drop cannot await). A `complete` cancelled half-way is aborted too: if the store
/// had completed it, the abort fails harmlessly (the object stays, uncommitted, as a failed
/// attempt's archive would).
#[derive(Debug)]
pub(crate) struct AbortOnDrop {
    upload: Option<Box<dyn MultipartUpload>>,
    location: Path,
    settled: bool,
}

#[async_trait]
impl MultipartUpload for AbortOnDrop {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.upload.as_mut() {
            Some(upload) => upload.put_part(data),
            None => Box::pin(futures::future::ready(Err(gone(&self.location)))),
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let upload = self.upload.as_mut().ok_or_else(|| gone(&self.location))?;
        let done = upload.complete().await;
        // A failed completion stays unsettled: the caller aborts, or the guard does on drop.
        self.settled = done.is_ok();
        done
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let upload = self.upload.as_mut().ok_or_else(|| gone(&self.location))?;
        let aborted = upload.abort().await;
        self.settled = aborted.is_ok();
        aborted
    }
}

fn gone(location: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "AbortingStore",
        source: format!("the multipart upload of {location} was already released").into(),
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Some(mut upload) = self.upload.take() else {
            return;
        };
        let location = std::mem::take(&mut self.location);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(archive = %location, "a cancelled multipart upload cannot be aborted outside a runtime; the bucket's lifecycle rule removes it");
            return;
        };
        info!(archive = %location, "the attempt was cancelled mid-upload; aborting its multipart upload");
        PENDING_ABORTS.spawn_on(
            async move {
                if let Err(e) = upload.abort().await {
                    warn!(archive = %location, error = %e, "aborting a cancelled multipart upload failed; the bucket's lifecycle rule removes it");
                }
            },
            &runtime,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use std::sync::Mutex;

    /// A multipart upload that records what happened to it.
    #[derive(Debug)]
    struct Recorder(Arc<Mutex<Vec<&'static str>>>);

    #[async_trait]
    impl MultipartUpload for Recorder {
        fn put_part(&mut self, _data: PutPayload) -> UploadPart {
            self.0.lock().expect("lock").push("part");
            Box::pin(futures::future::ready(Ok(())))
        }
        async fn complete(&mut self) -> object_store::Result<PutResult> {
            self.0.lock().expect("lock").push("complete");
            // Never answers, as a store that died mid-request.
            futures::future::pending().await
        }
        async fn abort(&mut self) -> object_store::Result<()> {
            self.0.lock().expect("lock").push("abort");
            Ok(())
        }
    }

    fn guard(log: &Arc<Mutex<Vec<&'static str>>>) -> AbortOnDrop {
        AbortOnDrop {
            upload: Some(Box::new(Recorder(Arc::clone(log)))),
            location: Path::from("a/b.tar"),
            settled: false,
        }
    }

    #[tokio::test]
    async fn a_dropped_unfinished_upload_is_aborted_and_a_finished_one_is_not() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut g = guard(&log);
        g.put_part(PutPayload::from_static(b"x"))
            .await
            .expect("part");
        drop(g);
        assert_eq!(wait_for_pending_aborts(Duration::from_secs(5)).await, 0);
        assert_eq!(*log.lock().expect("lock"), vec!["part", "abort"]);

        // A completion cancelled half-way (the drain timeout) is aborted too.
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut g = guard(&log);
        let cancelled = tokio::time::timeout(Duration::from_millis(10), g.complete()).await;
        assert!(cancelled.is_err());
        drop(g);
        assert_eq!(wait_for_pending_aborts(Duration::from_secs(5)).await, 0);
        assert_eq!(*log.lock().expect("lock"), vec!["complete", "abort"]);

        // An explicit abort settles it: no second abort on drop.
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut g = guard(&log);
        g.abort().await.expect("abort");
        drop(g);
        assert_eq!(wait_for_pending_aborts(Duration::from_secs(5)).await, 0);
        assert_eq!(*log.lock().expect("lock"), vec!["abort"]);
    }

    #[tokio::test]
    async fn a_completed_upload_through_the_store_is_kept() {
        let store = AbortingStore::new(Arc::new(InMemory::new()));
        let key = Path::from("k");
        let mut up = store
            .put_multipart_opts(&key, PutMultipartOptions::default())
            .await
            .expect("create");
        up.put_part(PutPayload::from_static(b"hello"))
            .await
            .expect("part");
        up.complete().await.expect("complete");
        drop(up);
        assert_eq!(wait_for_pending_aborts(Duration::from_secs(5)).await, 0);
        let got = object_store::ObjectStoreExt::get(&store, &key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(got.as_ref(), b"hello");
    }
}
