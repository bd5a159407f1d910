//! No orphaned multipart uploads, on an S3 server that lists them (docs/contract.md, "What the
//! store holds across attempts"; issue #10 item 4): before each attempt of an archive key, the
//! operator lists the key's open multipart uploads and aborts them (src/store/open_uploads.rs).
//!
//! The server is gofakes3 (`hack/store-emulators.sh up` starts it; SANDBOXRUN_TEST_GOFAKES3_*):
//! s3s-fs, the bed's main S3 server, does not implement ListMultipartUploads. Every check of what
//! is open goes through gofakes3's own listing (`GET /<bucket>?uploads`), read by this file's own
//! small parser, not the operator's.
//!
//! kwok plays the node (its exec runs the packer as a local process), as in tests/it/drain_e2e.rs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};
use sandboxrun_operator::api::{Compression, Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::identity::RunId;
use sandboxrun_operator::store::open_uploads::{
    before_attempt, Cleared, OpenUploads, OpenUploadsError, LIST_PERMISSION,
};
use sandboxrun_operator::store::{object_keys, store_from_url};

use crate::support::*;

const MIB: u64 = 1024 * 1024;

/// The bed's gofakes3: its URL, bucket and the store options the operator takes.
struct Gofakes3 {
    url: String,
    bucket: String,
    options: Vec<(String, String)>,
}

fn gofakes3() -> Gofakes3 {
    let url = bed_setting("SANDBOXRUN_TEST_GOFAKES3_URL");
    let options = s3_options(
        &url,
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_ACCESS_KEY"),
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_SECRET_KEY"),
    );
    Gofakes3 {
        bucket: bed_setting("SANDBOXRUN_TEST_GOFAKES3_BUCKET"),
        url,
        options,
    }
}

impl Gofakes3 {
    /// A store URL under a fresh prefix.
    fn store_url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// gofakes3's own listing of open uploads under `prefix`: (key, upload id) pairs. gofakes3
    /// answers a bucket that never had an upload with 404 NoSuchUpload: nothing open.
    async fn open_uploads(&self, prefix: &str) -> Vec<(String, String)> {
        let mut url = url::Url::parse(&format!("{}/{}", self.url, self.bucket)).expect("url");
        url.query_pairs_mut()
            .append_key_only("uploads")
            .append_pair("prefix", prefix);
        let resp = reqwest::get(url).await.expect("list open uploads");
        let status = resp.status().as_u16();
        let body = resp.text().await.expect("body");
        if status == 404 && body.contains("<Code>NoSuchUpload</Code>") {
            return Vec::new();
        }
        assert_eq!(status, 200, "{body}");
        xml_texts(&body, "Key")
            .into_iter()
            .zip(xml_texts(&body, "UploadId"))
            .collect()
    }

    /// The open uploads of exactly `key`.
    async fn open_uploads_of(&self, key: &str) -> Vec<String> {
        self.open_uploads(key)
            .await
            .into_iter()
            .filter(|(k, _)| k == key)
            .map(|(_, id)| id)
            .collect()
    }

    /// Aborts an upload directly (the tests' own clean-up).
    async fn abort(&self, key: &str, id: &str) {
        let url = format!("{}/{}/{key}?uploadId={id}", self.url, self.bucket);
        let _ = reqwest::Client::new().delete(url).send().await;
    }
}

/// Leaves an upload of `key` open with one part in it, as a process killed mid-upload does: the
/// upload is neither completed nor aborted (object_store's own uploads do not abort on drop).
async fn leave_open(store: &dyn ObjectStore, key: &str) {
    let mut upload = store
        .put_multipart(&object_store::path::Path::from(key))
        .await
        .expect("start a multipart upload");
    upload
        .put_part(PutPayload::from(vec![7u8; 5 * MIB as usize]))
        .await
        .expect("upload a part");
    drop(upload);
}

fn random_prefix(tag: &str) -> String {
    format!("{tag}{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------------
// The clean-up itself, against the server
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_pre_attempt_clean_up_aborts_the_open_uploads_of_exactly_the_key() {
    let s3 = gofakes3();
    let prefix = random_prefix("ou");
    let url = s3.store_url(&prefix);
    let (store, _) = store_from_url(&url, &s3.options).expect("store");
    let key = format!("{prefix}/ns/run/uid/00-out.tar");
    let other = format!("{key}-other");
    let below = format!("{key}/below");
    leave_open(store.as_ref(), &key).await;
    leave_open(store.as_ref(), &key).await;
    leave_open(store.as_ref(), &other).await;
    leave_open(store.as_ref(), &below).await;
    // The precondition: the server lists them.
    assert_eq!(
        s3.open_uploads_of(&key).await.len(),
        2,
        "two open for the key"
    );
    assert_eq!(s3.open_uploads(&prefix).await.len(), 4);

    let cleaner = OpenUploads::for_store(&url, &s3.options)
        .expect("configures")
        .expect("an s3:// store has a cleaner");
    let started = std::time::Instant::now();
    let cleared = cleaner
        .abort_open_uploads(&object_store::path::Path::from(key.as_str()))
        .await
        .expect("lists and aborts");
    // A number, printed (never asserted): what the clean-up adds to an attempt on loopback.
    eprintln!(
        "clean-up: listed 4 open uploads under the prefix, aborted 2, in {:?}",
        started.elapsed()
    );
    assert_eq!(
        cleared,
        Cleared {
            found: 2,
            aborted: 2
        }
    );

    assert_eq!(
        s3.open_uploads_of(&key).await,
        Vec::<String>::new(),
        "none open for the key"
    );
    let left = s3.open_uploads(&prefix).await;
    let mut left_keys: Vec<&str> = left.iter().map(|(k, _)| k.as_str()).collect();
    left_keys.sort_unstable();
    assert_eq!(
        left_keys,
        vec![other.as_str(), below.as_str()],
        "keys that only share the prefix keep their uploads"
    );
    assert!(
        cleaner.metric().with_label_values(&["aborted"]).get() == 2,
        "counted"
    );

    // A second pass finds nothing.
    let started = std::time::Instant::now();
    let again = cleaner
        .abort_open_uploads(&object_store::path::Path::from(key.as_str()))
        .await
        .expect("lists");
    eprintln!(
        "clean-up: nothing open for the key, one listing, in {:?}",
        started.elapsed()
    );
    assert_eq!(again, Cleared::default());
    for (k, id) in left {
        s3.abort(&k, &id).await;
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: the operator drains into gofakes3
// ---------------------------------------------------------------------------------------------

/// The archive key of path 0 of `run`.
fn archive_key(prefix: &str, ns: &str, run: &SandboxRun, path: &Path) -> String {
    let run_ref = RunId {
        namespace: ns.to_string(),
        name: run.name_any(),
        uid: run.uid().expect("uid"),
    };
    object_keys(
        &object_store::path::Path::from(prefix),
        &run_ref,
        0,
        &path.display().to_string(),
        Compression::None,
    )
    .archive
    .to_string()
}

/// Removes a directory when the test ends, passed or failed: the disk is shared.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn an_upload_left_open_by_a_killed_attempt_is_aborted_before_the_next_attempt() {
    let s3 = gofakes3();
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "openup").await;
    let prefix = random_prefix("ou");
    let url = s3.store_url(&prefix);
    let op = Operator::builder(&ns.name, &url)
        .store_options(&s3.options)
        .start();
    let src = host_dir("openup");
    let _remove = RemoveOnDrop(src.clone());
    std::fs::write(src.join("result.txt"), "42\n").expect("write");

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "r", spec(&[&src]).drain_timeout("2m")).await;
    let running = wait_phase(&runs, "r", Phase::Running, &op).await;

    // What a killed operator leaves: an open upload of the archive key (its drop guard never
    // ran), next to an open upload of another key that shares the prefix.
    let key = archive_key(&prefix, &ns.name, &running, &src);
    let other = format!("{key}-other");
    let (store, _) = store_from_url(&url, &s3.options).expect("store");
    leave_open(store.as_ref(), &key).await;
    leave_open(store.as_ref(), &other).await;
    assert_eq!(
        s3.open_uploads_of(&key).await.len(),
        1,
        "the orphan is open"
    );

    finish_workload(&pods, &pod_of(&running), 0).await;
    let run = wait_final(&runs, "r", &op, Duration::from_secs(180)).await;
    let entry = &run.status.as_ref().expect("status").read_back[0];
    assert_eq!(
        entry.phase,
        ReadBackPhase::Drained,
        "{entry:?}\n{}",
        op.log_text()
    );
    assert_eq!(
        s3.open_uploads_of(&key).await,
        Vec::<String>::new(),
        "the killed attempt's upload is aborted\n{}",
        op.log_text()
    );
    let others = s3.open_uploads_of(&other).await;
    assert_eq!(others.len(), 1, "another key's upload is not touched");
    assert!(
        op.log_text()
            .contains("aborted an open multipart upload of the archive key"),
        "{}",
        op.log_text()
    );
    for id in others {
        s3.abort(&other, &id).await;
    }
}

/// A packer that sends `.stream` from the declared directory (the start of a tar) and then stalls,
/// as a packer stuck on a file.
fn hanging_packer(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("hang-pack.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n# tests/it/store_open_uploads.rs: $1 is the declared path.\ncat \"$1/.stream\"; sleep 40; exit 0\n",
    )
    .expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

#[tokio::test]
async fn an_attempt_cancelled_by_its_timeout_leaves_no_open_upload_in_the_server_s_listing() {
    let s3 = gofakes3();
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "openup-timeout").await;
    let prefix = random_prefix("ou");
    let url = s3.store_url(&prefix);
    let bin = host_dir("openup-bin");
    let _remove_bin = RemoveOnDrop(bin.clone());
    let pack = format!("{} ", hanging_packer(&bin).display());
    let op = Operator::builder(&ns.name, &url)
        .store_options(&s3.options)
        .flags(&["--pack-command", &pack])
        .start();

    // 12 MiB of a 64 MiB member, then the packer stalls: past its first 5 MiB part, the archive
    // is a multipart upload with parts in the bucket when the drain timeout fires.
    let src = host_dir("openup-timeout");
    let _remove = RemoveOnDrop(src.clone());
    std::fs::write(src.join(".stream"), truncated_tar(64 * MIB, 12 * MIB)).expect("stream");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "stalls", spec(&[&src]).drain_timeout("12s")).await;
    let running = wait_phase(&runs, "stalls", Phase::Running, &op).await;
    let key = archive_key(&prefix, &ns.name, &running, &src);
    finish_workload(&pods, &pod_of(&running), 0).await;

    // The precondition that makes this test mean something: the server lists the upload open
    // mid-drain.
    let open = eventually_or_log(
        "the server to list an open upload of the archive",
        Duration::from_secs(60),
        &op,
        || {
            let s3 = &s3;
            let key = key.clone();
            async move {
                let ids = s3.open_uploads_of(&key).await;
                (!ids.is_empty()).then_some(ids)
            }
        },
    )
    .await;
    assert_eq!(open.len(), 1, "one attempt, one upload: {open:?}");

    let run = wait_final(&runs, "stalls", &op, Duration::from_secs(90)).await;
    let entry = &run.status.as_ref().expect("status").read_back[0];
    assert_eq!(entry.phase, ReadBackPhase::Failed, "{entry:?}");
    assert!(
        entry
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("drain timeout reached while attempt 1 was still streaming"),
        "{entry:?}"
    );
    // The server's own listing: nothing open for the key.
    eventually_or_log(
        "the server to list no open upload of the archive",
        Duration::from_secs(30),
        &op,
        || {
            let s3 = &s3;
            let key = key.clone();
            async move { s3.open_uploads_of(&key).await.is_empty().then_some(()) }
        },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The bed's main S3 server, s3s-fs, has no ListMultipartUploads
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_server_without_the_listing_is_skipped_and_never_fails_the_attempt() {
    let s3 = s3();
    let options = s3.options();
    let url = format!("s3://{}/{}", s3.bucket, random_prefix("ou"));
    let cleaner = OpenUploads::for_store(&url, &options)
        .expect("configures")
        .expect("an s3:// store has a cleaner");
    let key = object_store::path::Path::from("ou/ns/run/uid/00-out.tar");
    let err = cleaner
        .abort_open_uploads(&key)
        .await
        .expect_err("s3s-fs does not list open uploads");
    assert!(
        matches!(err, OpenUploadsError::Unsupported { .. }),
        "{err:?}"
    );
    assert_eq!(
        before_attempt(Some(&cleaner), &key, Duration::from_secs(20)).await,
        None
    );

    // s3s-fs checks signatures (gofakes3 does not): the listing above was not refused, so the
    // operator's SigV4 signature is accepted; with a wrong secret it is refused, and the error
    // names the permission to grant and the server's code. The attempt still goes ahead.
    let mut wrong = options.clone();
    wrong.retain(|(k, _)| k != "secret_access_key");
    wrong.push(("secret_access_key".into(), "not-the-secret".into()));
    let refused = OpenUploads::for_store(&url, &wrong)
        .expect("configures")
        .expect("cleaner");
    let err = refused.abort_open_uploads(&key).await.expect_err("refused");
    match &err {
        OpenUploadsError::Forbidden {
            status: 403,
            permission,
            ..
        } => assert_eq!(*permission, LIST_PERMISSION),
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("s3:ListBucketMultipartUploads"),
        "{err}"
    );
    assert_eq!(
        before_attempt(Some(&refused), &key, Duration::from_secs(20)).await,
        None
    );
}
