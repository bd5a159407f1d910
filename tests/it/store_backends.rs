//! Every object-store backend the docs offer, against a real server: S3 (s3s-fs), Google Cloud
//! Storage (fake-gcs-server) and Azure Blob Storage (Azurite), all started by the test bed
//! (`hack/local-cluster.sh up`, which runs `hack/store-emulators.sh up`). One test body per
//! property, run once per backend:
//!
//! - a tree with nested directories, symlinks and a few MiB drains, the manifest is written after
//!   the archive, and `files ls` / `files get` read it back identical;
//! - an outage in the middle of the upload (a loopback proxy in front of the store that cuts every
//!   connection once the upload is under way and refuses new ones for a while) is retried, and the
//!   backend's own listing shows no upload left in progress;
//! - a wrong credential fails the path at once with a message that names the backend and the
//!   settings to fix.
//!
//! What the emulators cannot show is said where it matters. object_store writes GCS objects through
//! GCS's XML API (a PUT per object, XML multipart uploads over one part, `x-goog-if-generation-match`
//! for the create-only manifest), and fake-gcs-server implements none of these (a plain XML PUT is
//! answered `400 invalid uploadType`; its issues #331 and #852). So for GCS the drain writes into a
//! file:// store, the test copies the objects into fake-gcs-server through its JSON upload API,
//! and what is proven against the GCS server is the *reader*: `files ls` / `files get` with the
//! service-account file, listing through the JSON API and reading through the XML API.
//! fake-gcs-server checks no credentials either, so the GCS "wrong credential" case is a
//! service-account file that cannot be read.
//!
//! kwok plays the node (its exec runs the packer as a local process), as in tests/it/drain_e2e.rs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt};
use sandboxrun_operator::api::{Compression, Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::store::{list_manifests, path_slug, run_prefix, store_from_url};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

const MIB: u64 = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// The backends
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    S3,
    Gcs,
    Azure,
}

/// A store URL with its options, as the operator and `files` take them.
#[derive(Clone, Debug)]
struct StoreSpec {
    url: String,
    options: Vec<(String, String)>,
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The address (host:port) of a backend's server in the test bed.
fn server_addr(backend: Backend) -> String {
    let endpoint = match backend {
        Backend::S3 => bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT"),
        Backend::Gcs => bed_setting("SANDBOXRUN_TEST_GCS_ENDPOINT"),
        Backend::Azure => bed_setting("SANDBOXRUN_TEST_AZURE_ENDPOINT"),
    };
    let u = url::Url::parse(&endpoint).expect("endpoint URL");
    format!(
        "{}:{}",
        u.host_str().expect("host"),
        u.port_or_known_default().expect("port")
    )
}

/// The store of `backend` under a fresh prefix, reached at `addr` (the server itself, or a proxy
/// in front of it). `secret` replaces the credential (the wrong-credential tests).
fn store_spec(backend: Backend, addr: &str, prefix: &str, secret: Option<&str>) -> StoreSpec {
    match backend {
        Backend::S3 => {
            let s3 = s3();
            StoreSpec {
                url: format!("s3://{}/{prefix}", s3.bucket),
                options: kv(&[
                    ("endpoint", &format!("http://{addr}")),
                    ("allow_http", "true"),
                    ("access_key_id", &s3.access_key),
                    ("secret_access_key", secret.unwrap_or(&s3.secret_key)),
                    ("region", "us-east-1"),
                ]),
            }
        }
        Backend::Gcs => {
            // The bed's service-account file names the server's URL; one of our own names `addr`.
            let bed_file = bed_setting("SANDBOXRUN_TEST_GCS_SERVICE_ACCOUNT");
            let text = std::fs::read_to_string(&bed_file).expect("the bed's GCS service account");
            let mut sa: serde_json::Value = serde_json::from_str(&text).expect("service account");
            sa["gcs_base_url"] = json!(format!("http://{addr}"));
            let file = host_dir("gcs-sa").join("service-account.json");
            std::fs::write(&file, sa.to_string()).expect("write service account");
            StoreSpec {
                url: format!(
                    "gs://{}/{prefix}",
                    bed_setting("SANDBOXRUN_TEST_GCS_BUCKET")
                ),
                options: kv(&[
                    (
                        "service_account",
                        secret.unwrap_or(&file.display().to_string()),
                    ),
                    ("allow_http", "true"),
                ]),
            }
        }
        Backend::Azure => {
            let account = bed_setting("SANDBOXRUN_TEST_AZURE_ACCOUNT");
            let key = bed_setting("SANDBOXRUN_TEST_AZURE_KEY");
            StoreSpec {
                url: format!(
                    "az://{}/{prefix}",
                    bed_setting("SANDBOXRUN_TEST_AZURE_CONTAINER")
                ),
                options: kv(&[
                    ("account_name", &account),
                    ("access_key", secret.unwrap_or(&key)),
                    ("endpoint", &format!("http://{addr}/{account}")),
                    ("allow_http", "true"),
                ]),
            }
        }
    }
}

fn prefix(tag: &str) -> String {
    format!("{tag}{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------------
// Runs on the kwok node
// ---------------------------------------------------------------------------------------------

/// Creates a batch run draining `path`, lets its workload exit 0, and returns it once it is final.
async fn drain(
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    op: &Operator,
    name: &str,
    path: &Path,
    drain_timeout: &str,
) -> SandboxRun {
    create(
        runs,
        name,
        spec(&[path])
            .compression(Compression::Zstd)
            .drain_timeout(drain_timeout),
    )
    .await;
    let running = wait_phase(runs, name, Phase::Running, op).await;
    finish_workload(pods, &pod_of(&running), 0).await;
    wait_final(runs, name, op, Duration::from_secs(240)).await
}

// ---------------------------------------------------------------------------------------------
// Trees
// ---------------------------------------------------------------------------------------------

/// `sandboxrun-operator files <args> --store-url … --store-option …`, as a reader runs it.
fn files_cli(store: &StoreSpec, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"));
    cmd.arg("files")
        .args(args)
        .args(["--store-url", &store.url])
        .args(store_flags(&store.options));
    run(cmd, None)
}

/// Every object under `prefix` with its last-modified time, by key.
async fn objects(
    store: &Arc<dyn ObjectStore>,
    prefix: &object_store::path::Path,
) -> BTreeMap<String, object_store::ObjectMeta> {
    let metas: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .expect("list the store");
    metas
        .into_iter()
        .map(|m| (m.location.to_string(), m))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. A tree round-trips
// ---------------------------------------------------------------------------------------------

/// The body of the round-trip tests: 3 MiB of data in 140 entries (nested and empty directories,
/// symlinks). Azure's block upload (parts) is exercised by the outage test.
async fn a_tree_round_trips(backend: Backend) {
    let tag = format!("{backend:?}").to_lowercase();
    // The reader's store; for GCS the writer's is a file:// store (see the module doc).
    let store = store_spec(
        backend,
        &server_addr(backend),
        &if backend == Backend::Gcs {
            String::new()
        } else {
            prefix(&tag)
        },
        None,
    );
    let file_store = host_dir(&format!("be-{tag}-store"));
    let _remove_file_store = RemoveOnDrop(file_store.clone());
    let writer = if backend == Backend::Gcs {
        StoreSpec {
            url: format!("file://{}", file_store.display()),
            options: Vec::new(),
        }
    } else {
        store.clone()
    };
    round_trip(&tag, &writer, &store, backend == Backend::Gcs).await;
}

/// Drains a tree through `writer` (the operator's settings) and reads it back through `reader`
/// (a laptop's); `copy_to_gcs`: the objects are copied into fake-gcs-server between the two.
async fn round_trip(tag: &str, writer: &StoreSpec, store: &StoreSpec, copy_to_gcs: bool) {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, &format!("be-{tag}")).await;
    let op = Operator::builder(&ns.name, &writer.url)
        .store_options(&writer.options)
        .start();
    let src = host_dir(&format!("be-{tag}"));
    let _remove_src = RemoveOnDrop(src.clone());
    make_tree(&src, 120, 3 * MIB);
    let want = snapshot(&src);

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let run = drain(&runs, &pods, &op, "tree", &src, "3m").await;
    let e = run.status.as_ref().expect("status").read_back[0].clone();
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}\n{}", op.log_text());
    assert_eq!(e.members, want.len() as u64, "{e:?}");

    // The store holds exactly the archive and its manifest, and the manifest came last.
    let (obj, key_prefix) = store_from_url(&writer.url, &writer.options).expect("store");
    let manifests = list_manifests(&obj, &key_prefix, &ns.name, "tree")
        .await
        .expect("list manifests");
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let (manifest_key, manifest) = &manifests[0];
    let stored = objects(&obj, &run_prefix(&key_prefix, &ns.name, "tree")).await;
    let mut want_keys = vec![manifest.archive_key.clone(), manifest_key.to_string()];
    want_keys.sort();
    assert_eq!(
        stored.keys().cloned().collect::<Vec<_>>(),
        want_keys,
        "one archive and one manifest"
    );
    let archive = &stored[&manifest.archive_key];
    let committed = &stored[&manifest_key.to_string()];
    assert_eq!(archive.size, manifest.totals.archive_bytes);
    assert!(
        committed.last_modified >= archive.last_modified,
        "the manifest ({}) is written after the archive ({})",
        committed.last_modified,
        archive.last_modified
    );

    if copy_to_gcs {
        copy_into_gcs(&obj, &run_prefix(&key_prefix, &ns.name, "tree")).await;
    }

    // A reader with the same settings: `files ls` lists every member, `files get` restores the
    // tree byte for byte.
    let ls = files_cli(store, &["ls", "tree", "-n", &ns.name]);
    let ls_text = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(
        ls.status.success(),
        "{ls_text}{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    assert!(ls_text.contains("[Drained]"), "{ls_text}");
    for path in want.keys() {
        assert!(
            ls_text.contains(path.as_str()),
            "{path} missing from:\n{ls_text}"
        );
    }
    let out = host_dir(&format!("be-{tag}-get"));
    let _remove_out = RemoveOnDrop(out.clone());
    let get = files_cli(
        store,
        &[
            "get",
            "tree",
            "-n",
            &ns.name,
            "-o",
            &out.display().to_string(),
        ],
    );
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let got = out.join(format!("00-{}", path_slug(&src.display().to_string())));
    assert_eq!(snapshot(&got), want, "files get restores the source tree");
}

#[tokio::test]
async fn a_tree_round_trips_through_s3() {
    a_tree_round_trips(Backend::S3).await;
}

#[tokio::test]
async fn a_tree_round_trips_through_gcs() {
    a_tree_round_trips(Backend::Gcs).await;
}

#[tokio::test]
async fn a_tree_round_trips_through_azure() {
    a_tree_round_trips(Backend::Azure).await;
}

/// An account SAS of the bed's Azure account for the blob service, valid until 2030, with
/// `permissions` (Azure's letters: r read, a add, c create, w write, l list).
fn azure_account_sas(permissions: &str) -> String {
    let account = bed_setting("SANDBOXRUN_TEST_AZURE_ACCOUNT");
    let key = bed_setting("SANDBOXRUN_TEST_AZURE_KEY");
    let (version, expiry) = ("2021-08-06", "2030-01-01T00:00:00Z");
    // The account SAS string-to-sign of versions 2020-12-06 and later: account, permissions,
    // services, resource types, start, expiry, IP, protocol, version, encryption scope.
    let to_sign = format!("{account}\n{permissions}\nb\nsco\n\n{expiry}\n\n\n{version}\n\n");
    let key_bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &key)
        .expect("base64 key");
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key_bytes),
        to_sign.as_bytes(),
    );
    let sig = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, mac.as_ref());
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("sv", version)
        .append_pair("ss", "b")
        .append_pair("srt", "sco")
        .append_pair("sp", permissions)
        .append_pair("se", expiry)
        .append_pair("sig", &sig)
        .finish()
}

/// Azure with SAS tokens instead of the account key: the operator writes with the permissions
/// docs/operations.md gives it (`racwl`), a reader reads with a read/list-only SAS (`rl`).
#[tokio::test]
async fn a_tree_round_trips_through_azure_with_sas_tokens_write_for_the_operator_read_for_readers()
{
    let with_sas = |permissions: &str, p: &str| {
        let mut spec = store_spec(Backend::Azure, &server_addr(Backend::Azure), p, None);
        spec.options.retain(|(k, _)| k != "access_key");
        spec.options
            .push(("sas_key".to_string(), azure_account_sas(permissions)));
        spec
    };
    let p = prefix("azsas");
    let reader = with_sas("rl", &p);
    round_trip("azsas", &with_sas("racwl", &p), &reader, false).await;
    // The emulator enforces the token: the reader's cannot write.
    let (ro, ro_prefix) = store_from_url(&reader.url, &reader.options).expect("store");
    let denied = ro
        .put(
            &ro_prefix.clone().join("denied"),
            object_store::PutPayload::from_static(b"x"),
        )
        .await;
    match denied {
        Err(e) => assert!(
            sandboxrun_operator::store::credentials::is_refused(&e),
            "a refusal, not {e}"
        ),
        Ok(_) => panic!("a read/list SAS wrote an object"),
    }
}

// ---------------------------------------------------------------------------------------------
// 2. An outage in the middle of the upload
// ---------------------------------------------------------------------------------------------

/// A loopback TCP proxy in front of a store: it forwards until `trip_after` request bytes have gone
/// through, then cuts every open connection and refuses new ones for `outage` (the store is
/// unreachable mid-upload), then forwards again.
struct OutageProxy {
    addr: String,
    tripped: Arc<AtomicBool>,
    cut: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OutageProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    trip_after: u64,
    outage: Duration,
    sent: Arc<AtomicU64>,
    tripped: Arc<AtomicBool>,
    cut: Arc<AtomicU64>,
    down_until: Arc<Mutex<Option<Instant>>>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

async fn outage_proxy(upstream: String, trip_after: u64, outage: Duration) -> OutageProxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address").to_string();
    let state = ProxyState {
        upstream,
        trip_after,
        outage,
        sent: Arc::default(),
        tripped: Arc::default(),
        cut: Arc::default(),
        down_until: Arc::default(),
        conns: Arc::default(),
    };
    let (tripped, cut) = (Arc::clone(&state.tripped), Arc::clone(&state.cut));
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let down = state
                .down_until
                .lock()
                .expect("lock")
                .is_some_and(|t| Instant::now() < t);
            if down {
                state.cut.fetch_add(1, Ordering::SeqCst);
                drop(client);
                continue;
            }
            let conn = tokio::spawn(pipe(client, state.clone()));
            state.conns.lock().expect("lock").push(conn.abort_handle());
        }
    });
    OutageProxy {
        addr,
        tripped,
        cut,
        task,
    }
}

async fn pipe(client: tokio::net::TcpStream, state: ProxyState) {
    let Ok(server) = tokio::net::TcpStream::connect(&state.upstream).await else {
        return;
    };
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let total = state.sent.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
            if total >= state.trip_after && !state.tripped.swap(true, Ordering::SeqCst) {
                *state.down_until.lock().expect("lock") = Some(Instant::now() + state.outage);
                let all: Vec<_> = state.conns.lock().expect("lock").drain(..).collect();
                state.cut.fetch_add(all.len() as u64, Ordering::SeqCst);
                // Every connection, this one included (it ends at its next await).
                for conn in all {
                    conn.abort();
                }
                return;
            }
            if server_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_w.shutdown().await;
    };
    let responses = async {
        let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
    };
    tokio::join!(requests, responses);
}

/// A GET of Azure Storage's REST API signed with the account's shared key (the emulator's own
/// API, which object_store does not expose): `path` after the account, `query` unencoded.
async fn azure_get(path: &str, query: &[(&str, &str)]) -> String {
    let account = bed_setting("SANDBOXRUN_TEST_AZURE_ACCOUNT");
    let key = bed_setting("SANDBOXRUN_TEST_AZURE_KEY");
    let endpoint = bed_setting("SANDBOXRUN_TEST_AZURE_ENDPOINT");
    let mut url = url::Url::parse(&format!("{endpoint}/{path}")).expect("url");
    for (k, v) in query {
        url.query_pairs_mut().append_pair(k, v);
    }
    let date = jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&jiff::Timestamp::now())
        .expect("date");
    let version = "2021-08-06";
    let mut sorted: Vec<&(&str, &str)> = query.iter().collect();
    sorted.sort();
    let mut resource = format!("/{account}{}", url.path());
    for (k, v) in sorted {
        resource.push_str(&format!("\n{k}:{v}"));
    }
    let to_sign =
        format!("GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n{resource}");
    let key_bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &key)
        .expect("base64 key");
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key_bytes),
        to_sign.as_bytes(),
    );
    let sig = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, mac.as_ref());
    let resp = reqwest::Client::new()
        .get(url.clone())
        .header("x-ms-date", date)
        .header("x-ms-version", version)
        .header("Authorization", format!("SharedKey {account}:{sig}"))
        .send()
        .await
        .expect("azure request");
    let status = resp.status();
    let text = resp.text().await.expect("azure response");
    assert!(status.is_success(), "GET {url}: {status}\n{text}");
    text
}

/// Azure: 24 MiB (random, so zstd keeps it) is five 5 MiB blocks; the proxy cuts every connection
/// after 7 MiB, while blocks are in flight, and refuses connections for 5 s. The drain must end
/// Drained, identical, with one archive and one manifest, and Azure's own listing (which can show
/// blobs that have only uncommitted blocks) must show no block left uncommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_outage_mid_upload_is_retried_and_leaves_no_uncommitted_blocks() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "be-az-outage").await;
    let proxy = outage_proxy(server_addr(Backend::Azure), 7 * MIB, Duration::from_secs(5)).await;
    let key_prefix_text = prefix("azo");
    let via_proxy = store_spec(Backend::Azure, &proxy.addr, &key_prefix_text, None);
    let direct = store_spec(
        Backend::Azure,
        &server_addr(Backend::Azure),
        &key_prefix_text,
        None,
    );
    let op = Operator::builder(&ns.name, &via_proxy.url)
        .store_options(&via_proxy.options)
        .start();
    let src = host_dir("be-az-outage");
    let _remove_src = RemoveOnDrop(src.clone());
    make_tree(&src, 120, 24 * MIB);
    let want = snapshot(&src);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let run = drain(&runs, &pods, &op, "outage", &src, "4m").await;
    let e = run.status.as_ref().expect("status").read_back[0].clone();
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}\n{}", op.log_text());
    assert!(
        proxy.tripped.load(Ordering::SeqCst),
        "the outage happened during the upload"
    );
    assert!(
        proxy.cut.load(Ordering::SeqCst) >= 1,
        "connections were cut or refused"
    );

    // The store holds exactly the archive and its manifest, and they read back identical.
    let (obj, key_prefix) = store_from_url(&direct.url, &direct.options).expect("store");
    let manifests = list_manifests(&obj, &key_prefix, &ns.name, "outage")
        .await
        .expect("list manifests");
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let (manifest_key, manifest) = &manifests[0];
    let committed: Vec<String> = objects(&obj, &key_prefix).await.into_keys().collect();
    let mut want_keys = vec![manifest.archive_key.clone(), manifest_key.to_string()];
    want_keys.sort();
    assert_eq!(committed, want_keys, "one archive and one manifest");
    let out = host_dir("be-az-outage-get");
    let _remove_out = RemoveOnDrop(out.clone());
    let get = files_cli(
        &direct,
        &[
            "get",
            "outage",
            "-n",
            &ns.name,
            "-o",
            &out.display().to_string(),
        ],
    );
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let got = out.join(format!("00-{}", path_slug(&src.display().to_string())));
    assert_eq!(snapshot(&got), want, "files get restores the source tree");

    // Azure's own API: the listing with uncommitted blobs names nothing more, and the archive's
    // block list has its blocks committed (it was a block upload) and none uncommitted.
    let container = bed_setting("SANDBOXRUN_TEST_AZURE_CONTAINER");
    let list_with_uncommitted = |prefix: String| {
        let container = container.clone();
        async move {
            azure_get(
                &container,
                &[
                    ("restype", "container"),
                    ("comp", "list"),
                    ("include", "uncommittedblobs"),
                    ("prefix", &prefix),
                ],
            )
            .await
        }
    };
    // A control, so that the listing below can fail: a block upload left uncommitted (object_store's
    // Azure abort is a no-op; Azure drops such blocks after a week) shows up in that listing.
    let control_prefix = format!("ctl{key_prefix_text}");
    let control_key = object_store::path::Path::from(format!("{control_prefix}/left.bin"));
    let mut left = obj
        .put_multipart(&control_key)
        .await
        .expect("start a block upload");
    left.put_part(object_store::PutPayload::from(vec![7u8; 1024]))
        .await
        .expect("upload one block");
    drop(left);
    let control = list_with_uncommitted(control_prefix).await;
    assert_eq!(
        xml_texts(&control, "Name"),
        vec![control_key.to_string()],
        "Azurite lists a blob that has only uncommitted blocks:\n{control}"
    );
    let listing = list_with_uncommitted(key_prefix_text.clone()).await;
    let mut listed = xml_texts(&listing, "Name");
    listed.sort();
    assert_eq!(
        listed, want_keys,
        "no blob with only uncommitted blocks:\n{listing}"
    );
    let blocks = azure_get(
        &format!("{container}/{}", manifest.archive_key),
        &[("comp", "blocklist"), ("blocklisttype", "all")],
    )
    .await;
    let committed_part = blocks
        .split("<UncommittedBlocks")
        .next()
        .unwrap_or_default();
    let uncommitted_part = blocks
        .split("<UncommittedBlocks")
        .nth(1)
        .unwrap_or_default();
    assert!(
        xml_texts(committed_part, "Name").len() >= 2,
        "the archive went up as a block upload:\n{blocks}"
    );
    assert!(
        xml_texts(uncommitted_part, "Name").is_empty(),
        "no block left uncommitted:\n{blocks}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. A wrong credential
// ---------------------------------------------------------------------------------------------

/// The drain with a wrong secret fails the path on its first attempt (not retried until the drain
/// timeout), with a message naming the backend and the settings to fix.
async fn a_wrong_credential_fails_the_path_at_once(backend: Backend, wrong: &str, names: &[&str]) {
    let client = client().await;
    ensure_crd(&client).await;
    let tag = format!("{backend:?}").to_lowercase();
    let ns = TestNamespace::new(&client, &format!("be-{tag}-cred")).await;
    let store = store_spec(backend, &server_addr(backend), &prefix(&tag), Some(wrong));
    let op = Operator::builder(&ns.name, &store.url)
        .store_options(&store.options)
        .start();
    let src = host_dir(&format!("be-{tag}-cred"));
    let _remove_src = RemoveOnDrop(src.clone());
    std::fs::write(src.join("result.json"), b"{\"ok\":true}\n").expect("write");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // A drain timeout far longer than the test waits: a retried failure would still be Pending.
    let run = drain(&runs, &pods, &op, "cred", &src, "10m").await;
    let e = run.status.as_ref().expect("status").read_back[0].clone();
    assert_eq!(e.phase, ReadBackPhase::Failed, "{e:?}");
    // Refused at the commit check before the first upload (attempts 0), or by the upload of the
    // first attempt (1): never retried. The drain timeout above keeps a retried one Pending.
    assert!(e.attempts <= 1, "final, not retried: {e:?}");
    let message = e.message.unwrap_or_default();
    for name in names {
        assert!(message.contains(name), "{name:?} missing from: {message}");
    }
    // A reader with the same wrong credential is told the same.
    let ls = files_cli(&store, &["ls", "cred", "-n", &ns.name]);
    let stderr = String::from_utf8_lossy(&ls.stderr);
    assert_eq!(ls.status.code(), Some(1), "{stderr}");
    let reader_words = names[0].replace("the operator's credentials", "these credentials");
    assert!(
        stderr.contains(&reader_words),
        "{reader_words:?} missing from: {stderr}"
    );
}

#[tokio::test]
async fn a_wrong_s3_secret_fails_the_drain_at_once_naming_s3_and_its_settings() {
    a_wrong_credential_fails_the_path_at_once(
        Backend::S3,
        "not-the-secret",
        &[
            "S3 refused the operator's credentials",
            "secret_access_key",
            "AWS_SECRET_ACCESS_KEY",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_wrong_azure_key_fails_the_drain_at_once_naming_azure_and_its_settings() {
    // A well-formed key (base64) that is not the account's.
    a_wrong_credential_fails_the_path_at_once(
        Backend::Azure,
        "bm90LXRoZS1hY2NvdW50LWtleS1hdC1hbGwtMDEyMzQ1Njc4OQ==",
        &[
            "Azure Blob Storage refused the operator's credentials",
            "access_key",
            "AZURE_STORAGE_ACCOUNT_KEY",
        ],
    )
    .await;
}

/// fake-gcs-server accepts any credential, so a GCS credential is proven wrong where the client
/// reads it: a service-account file that is not one stops `files` (and the operator, which
/// configures its store the same way at startup) with an error naming gs:// and the setting.
#[test]
fn an_unreadable_gcs_service_account_stops_files_naming_gcs_and_the_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("service-account.json");
    std::fs::write(&bad, b"this is not a service account").expect("write");
    let store = StoreSpec {
        url: "gs://sandboxrun-test".into(),
        options: kv(&[("service_account", &bad.display().to_string())]),
    };
    let out = files_cli(&store, &["ls", "anything", "-n", "default"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("configuring the gs:// store"), "{stderr}");
    assert!(stderr.contains("option service_account"), "{stderr}");
}
