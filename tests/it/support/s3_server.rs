//! A private s3s-fs (the S3 server of the test bed's build) for one test: its own port and root,
//! stoppable and restartable, and its on-disk state readable. s3s-fs does not implement
//! ListMultipartUploads, so the open uploads of a key are observed where s3s-fs keeps them: one
//! `.bucket-<b64 bucket>.object-<b64 key>.upload-<id>.metadata.json` per open upload in its root
//! (removed by abort and by complete), beside `.upload_id-<id>.part-<n>` part files.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;

use super::{free_port, host_dir};

const KEY: &str = "drain-commit";
const SECRET: &str = "drain-commit-secret";

/// A private s3s-fs process.
pub struct PrivateS3 {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its root directory (buckets are directories under it).
    pub root: PathBuf,
    /// The one bucket it serves.
    pub bucket: String,
    child: Option<Child>,
}

impl PrivateS3 {
    fn bin() -> PathBuf {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".cache"));
        cache.join("sandboxrun-operator/s3s-fs-0.14.1/bin/s3s-fs")
    }

    /// Starts one with a fresh root and bucket.
    pub fn new(tag: &str) -> PrivateS3 {
        let root = host_dir(&format!("s3-{tag}"));
        let bucket = "commit".to_string();
        std::fs::create_dir_all(root.join(&bucket)).expect("bucket dir");
        let mut s = PrivateS3 {
            port: free_port(),
            root,
            bucket,
            child: None,
        };
        s.start();
        s
    }

    /// (Re)starts the process on the same port and root.
    pub fn start(&mut self) {
        let log = std::fs::File::create(self.root.with_extension("log")).expect("s3 log");
        let child = Command::new(Self::bin())
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", KEY, "--secret-key", SECRET])
            .arg(&self.root)
            .stdout(Stdio::from(log.try_clone().expect("clone log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", Self::bin().display()));
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        for _ in 0..100 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("s3s-fs did not listen on {addr}");
    }

    /// Stops the process.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The store URL (prefix `runs`).
    pub fn url(&self) -> String {
        format!("s3://{}/runs", self.bucket)
    }

    /// Store options pointing at `endpoint` (this server, or a proxy in front of it).
    pub fn options_via(&self, endpoint: &str) -> Vec<(String, String)> {
        [
            ("endpoint", endpoint.to_string()),
            ("allow_http", "true".into()),
            ("access_key_id", KEY.into()),
            ("secret_access_key", SECRET.into()),
            ("region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Store options pointing at this server.
    pub fn options(&self) -> Vec<(String, String)> {
        self.options_via(&format!("http://127.0.0.1:{}", self.port))
    }

    /// Upload ids of the multipart uploads open for `key` (the object key in the bucket).
    pub fn open_uploads(&self, key: &str) -> Vec<String> {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let prefix = format!(".bucket-{}.object-{}.upload-", b64(&self.bucket), b64(key));
        let mut ids: Vec<String> = std::fs::read_dir(&self.root)
            .expect("read the s3 root")
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| {
                n.strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_suffix(".metadata.json"))
                    .map(str::to_string)
            })
            .collect();
        ids.sort();
        ids
    }

    /// Part files of any open multipart upload.
    pub fn part_files(&self) -> Vec<String> {
        std::fs::read_dir(&self.root)
            .expect("read the s3 root")
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(".upload_id-"))
            .collect()
    }
}

impl Drop for PrivateS3 {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
