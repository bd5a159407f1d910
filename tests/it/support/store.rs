//! The object stores of the test bed, as flags and options the operator and the library take.

use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use sandboxrun_operator::api::SandboxRun;
use sandboxrun_operator::identity::RunId;

use super::{bed_setting, host_dir};

/// The S3 server of the test bed, from `hack/local-cluster.sh env`.
#[derive(Clone, Debug)]
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
}

/// S3 settings of the running test bed (fails with instructions when absent).
pub fn s3() -> S3 {
    let get = bed_setting;
    S3 {
        endpoint: get("SANDBOXRUN_TEST_S3_ENDPOINT"),
        bucket: get("SANDBOXRUN_TEST_S3_BUCKET"),
        access_key: get("SANDBOXRUN_TEST_S3_ACCESS_KEY"),
        secret_key: get("SANDBOXRUN_TEST_S3_SECRET_KEY"),
    }
}

impl S3 {
    /// The environment `files get` on this host reads this server with (its credentials, its
    /// plain-HTTP endpoint).
    pub fn host_env(&self) -> [(&'static str, &str); 5] {
        [
            ("AWS_ACCESS_KEY_ID", self.access_key.as_str()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
        ]
    }

    /// The `--store-option`s (and library options) of this server, with its own secret.
    pub fn options(&self) -> Vec<(String, String)> {
        self.options_with_secret(&self.secret_key)
    }

    /// [`S3::options`] with another secret (a wrong one, for refusal tests).
    pub fn options_with_secret(&self, secret: &str) -> Vec<(String, String)> {
        s3_options(&self.endpoint, &self.access_key, secret)
    }
}

/// The options of an S3 endpoint over plain HTTP on loopback.
pub fn s3_options(endpoint: &str, access_key: &str, secret_key: &str) -> Vec<(String, String)> {
    [
        ("endpoint", endpoint),
        ("allow_http", "true"),
        ("access_key_id", access_key),
        ("secret_access_key", secret_key),
        ("region", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `options` as `--store-option key=value` flags.
pub fn store_flags(options: &[(String, String)]) -> Vec<String> {
    options
        .iter()
        .flat_map(|(k, v)| ["--store-option".to_string(), format!("{k}={v}")])
        .collect()
}

/// The texts of every `<tag>…</tag>` in `xml`, in order (the listings are flat and trusted).
pub fn xml_texts(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|s| s.split_once(close.as_str()).map(|(t, _)| t.to_string()))
        .collect()
}

/// A fresh `file://` store on this host: its directory and its URL.
pub fn file_store(tag: &str) -> (PathBuf, String) {
    let dir = host_dir(&format!("store-{tag}"));
    let url = format!("file://{}", dir.display());
    (dir, url)
}

/// `sandboxrun-operator files get <run> -n <ns>` from the store at `store_url` (with `options` as
/// `--store-option`s and `env` set) into a fresh host directory: Ok(that directory), or Err(what
/// the command printed) when it fails.
pub fn files_get(
    ns: &str,
    run: &str,
    store_url: &str,
    options: &[(String, String)],
    env: &[(&str, &str)],
) -> Result<PathBuf, String> {
    let dest = host_dir(&format!("{run}-get"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args(["files", "get", run, "-n", ns, "--store-url", store_url])
        .args(store_flags(options))
        .arg("-o")
        .arg(&dest)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run files get: {e}"));
    if out.status.success() {
        Ok(dest)
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every key under `dir` of `store`, sorted.
pub async fn keys_under(
    store: &Arc<dyn ObjectStore>,
    dir: &object_store::path::Path,
) -> Vec<String> {
    let metas: Vec<_> = store
        .list(Some(dir))
        .try_collect()
        .await
        .expect("list the store");
    let mut keys: Vec<String> = metas.into_iter().map(|m| m.location.to_string()).collect();
    keys.sort();
    keys
}

/// The store's name for `run` of namespace `ns`.
pub fn run_ref(ns: &str, run: &SandboxRun) -> RunId {
    RunId {
        namespace: ns.to_string(),
        name: run.metadata.name.clone().expect("name"),
        uid: run.metadata.uid.clone().expect("uid"),
    }
}

/// Copies every object under `dir` of `from` into fake-gcs-server's bucket under the same key
/// (a manifest records its archives' keys: they must not move), through its JSON API's media
/// upload: fake-gcs-server takes none of object_store's XML writes (store_backends' module doc).
pub async fn copy_into_gcs(from: &Arc<dyn ObjectStore>, dir: &object_store::path::Path) {
    let bucket = bed_setting("SANDBOXRUN_TEST_GCS_BUCKET");
    let endpoint = bed_setting("SANDBOXRUN_TEST_GCS_ENDPOINT");
    let http = reqwest::Client::new();
    for key in keys_under(from, dir).await {
        let body = from
            .get(&key.as_str().into())
            .await
            .expect("get")
            .bytes()
            .await
            .expect("read");
        let mut url = url::Url::parse(&format!(
            "{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media"
        ))
        .expect("url");
        url.query_pairs_mut().append_pair("name", &key);
        let resp = http.post(url).body(body).send().await.expect("upload");
        assert!(
            resp.status().is_success(),
            "upload {key}: {}",
            resp.status()
        );
    }
}
