//! A run's drained files: `files get` of an attempt or a checkpoint, the extracted directory of a
//! declared path, a file's mode and digest.

use super::*;

/// The extracted directory of declared path `index` under a `files get` destination.
pub(super) fn extracted(dest: &Path, index: usize) -> PathBuf {
    let prefix = format!("{index:02}-");
    std::fs::read_dir(dest)
        .expect("read files get output")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .unwrap_or_else(|| panic!("no {prefix}* directory in {}", dest.display()))
}

pub(super) fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `files get --attempt N` of a run into a fresh directory: the extracted first path's directory.
pub(super) fn files_get_attempt(ns: &str, run: &str, store_url: &str, attempt: u32) -> PathBuf {
    files_get_one(ns, run, store_url, ("--attempt", attempt))
}

/// `files get --checkpoint N` of `run` (its first path's extracted directory).
pub(super) fn files_get_checkpoint(
    ns: &str,
    run: &str,
    store_url: &str,
    checkpoint: u32,
) -> PathBuf {
    files_get_one(ns, run, store_url, ("--checkpoint", checkpoint))
}

/// `files get <flag> N` of `run` into a fresh directory; its first path's extracted directory.
pub(super) fn files_get_one(
    ns: &str,
    run: &str,
    store_url: &str,
    (flag, n): (&str, u32),
) -> PathBuf {
    let dest = host_dir(&format!("{run}-get{flag}-{n}"));
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args(["files", "get", run, "-n", ns, "--store-url", store_url])
        .args([flag, &n.to_string(), "-o"])
        .arg(&dest)
        .output()
        .expect("run files get");
    assert!(
        out.status.success(),
        "files get {flag} {n}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    extracted(&dest, 0)
}
