//! Where one run's archives and manifests live (docs/contract.md §3; drawn in docs/architecture.md).

use object_store::path::Path;

use crate::api::Compression;
use crate::identity::RunId;

/// Suffix of manifest objects.
pub const MANIFEST_SUFFIX: &str = ".manifest.json";
/// Longest path slug in a key.
pub const MAX_SLUG_BYTES: usize = 64;

/// Where one declared path's archive and manifest live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKeys {
    /// The archive: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.<ext>`.
    pub archive: Path,
    /// The manifest: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.manifest.json`.
    pub manifest: Path,
}

/// The keys of the `index`-th declared path of a run.
///
/// Layout: `<prefix>/<namespace>/<name>/<uid>/<index>-<slug>.<ext>` for the archive (`ext` is
/// `tar`, `tar.gz` or `tar.zst`) and `<…>/<index>-<slug>.manifest.json` for its manifest, where
/// `index` is the path's position in `spec.readBack.paths`, zero-padded to 2 digits (it keeps two
/// paths with the same slug apart) and `slug` is [`path_slug`]. The manifest key carries no
/// compression extension on purpose: a reader finds the commit point from the run and the path
/// alone, and the manifest names the archive key.
pub fn object_keys(
    prefix: &Path,
    run: &RunId,
    index: usize,
    declared_path: &str,
    compression: Compression,
) -> ObjectKeys {
    let dir = run_dir(prefix, run);
    let stem = format!("{index:02}-{}", path_slug(declared_path));
    ObjectKeys {
        archive: dir
            .clone()
            .join(format!("{stem}.{}", compression.extension()).as_str()),
        manifest: manifest_key(prefix, run, index, declared_path),
    }
}

/// The keys of the `index`-th declared path in the run's `attempt`-th attempt (`spec.retryPolicy`,
/// docs/user-guide.md "Retries"): the first attempt's are [`object_keys`] (so a run without
/// retries, and every run stored before them, keeps its layout); a later attempt's are the same
/// names under `<uid>/attempt-<N>/`, inside the run's own directory (retention deletes them with
/// it).
pub fn attempt_object_keys(
    prefix: &Path,
    run: &RunId,
    attempt: u32,
    index: usize,
    declared_path: &str,
    compression: Compression,
) -> ObjectKeys {
    let keys = object_keys(prefix, run, index, declared_path, compression);
    if attempt <= 1 {
        return keys;
    }
    in_generation(prefix, run, &format!("attempt-{attempt}"), keys)
}

/// The keys of the `index`-th declared path in the run's `checkpoint`-th checkpoint
/// (`spec.checkpoint`, docs/user-guide.md "Checkpoints"): the same names under
/// `<uid>/checkpoint-<N>/`, inside the run's own directory.
pub fn checkpoint_object_keys(
    prefix: &Path,
    run: &RunId,
    checkpoint: u32,
    index: usize,
    declared_path: &str,
    compression: Compression,
) -> ObjectKeys {
    let keys = object_keys(prefix, run, index, declared_path, compression);
    in_generation(prefix, run, &format!("checkpoint-{checkpoint}"), keys)
}

/// `keys`' names under `<uid>/<generation>/`.
fn in_generation(prefix: &Path, run: &RunId, generation: &str, keys: ObjectKeys) -> ObjectKeys {
    let dir = run_dir(prefix, run).join(generation);
    let name = |key: &Path| key.filename().unwrap_or_default().to_string();
    ObjectKeys {
        archive: dir.clone().join(name(&keys.archive).as_str()),
        manifest: dir.join(name(&keys.manifest).as_str()),
    }
}

/// The manifest key of the `index`-th declared path of a run ([`object_keys`]' `manifest`): it
/// does not depend on the compression.
pub fn manifest_key(prefix: &Path, run: &RunId, index: usize, declared_path: &str) -> Path {
    let stem = format!("{index:02}-{}", path_slug(declared_path));
    run_dir(prefix, run).join(format!("{stem}{MANIFEST_SUFFIX}").as_str())
}

/// `<prefix>/<namespace>/<name>/<uid>`: the directory of every key [`object_keys`] names for one
/// run (this uid only), and the only prefix `readBack.retention: Delete` deletes under.
pub fn run_dir(prefix: &Path, run: &RunId) -> Path {
    run_prefix(prefix, &run.namespace, &run.name).join(run.uid.as_str())
}

/// `<prefix>/<namespace>/<name>`: everything stored for a run name, all uids.
pub fn run_prefix(prefix: &Path, namespace: &str, name: &str) -> Path {
    prefix.clone().join(namespace).join(name)
}

/// A safe ASCII rendering of a declared path for object keys: `/work/out` → `work-out`. Keeps
/// `[A-Za-z0-9_]`, turns every other run of bytes into one `-`, trims `-` at both ends, bounds the
/// length to [`MAX_SLUG_BYTES`], and is never empty (`path` when nothing is left).
pub fn path_slug(declared: &str) -> String {
    let mut slug = String::with_capacity(declared.len().min(MAX_SLUG_BYTES));
    for c in declared.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
        if slug.len() >= MAX_SLUG_BYTES {
            break;
        }
    }
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        "path".into()
    } else {
        slug.into()
    }
}

/// Every key under `dir` (the store's listing, read whole), or the listing's error naming `dir`.
pub(crate) async fn list_keys(
    store: &dyn object_store::ObjectStore,
    dir: &object_store::path::Path,
) -> Result<Vec<object_store::path::Path>, super::error::StoreError> {
    use futures::TryStreamExt;
    let metas: Vec<_> = store
        .list(Some(dir))
        .try_collect()
        .await
        .map_err(|source| super::error::StoreError::Object {
            op: "listing",
            key: dir.to_string(),
            source,
        })?;
    Ok(metas.into_iter().map(|m| m.location).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        RunId {
            namespace: "ns".into(),
            name: "job".into(),
            uid: "1234-abcd".into(),
        }
    }

    /// The purge deletes the manifests by [`manifest_key`] first: it must be the key a drain
    /// commits, whatever the archive's compression.
    #[test]
    fn the_manifest_key_is_the_one_object_keys_names_for_every_compression() {
        let prefix = Path::from("drains");
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let keys = object_keys(&prefix, &run(), 3, "/work/out", compression);
            assert_eq!(manifest_key(&prefix, &run(), 3, "/work/out"), keys.manifest);
        }
    }

    #[test]
    fn slug_is_safe_ascii_bounded_and_never_empty() {
        assert_eq!(path_slug("/work/out"), "work-out");
        assert_eq!(path_slug("/a//b.c/Ü-x_y"), "a-b-c-x_y");
        assert_eq!(path_slug("/"), "path");
        assert_eq!(path_slug("/ü/é"), "path");
        let long = format!("/{}", "x".repeat(500));
        assert_eq!(path_slug(&long).len(), MAX_SLUG_BYTES);
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let keys = object_keys(
            &Path::from("drains"),
            &run(),
            3,
            "/work/out",
            Compression::Zstd,
        );
        assert_eq!(
            keys.archive.as_ref(),
            "drains/ns/job/1234-abcd/03-work-out.tar.zst"
        );
        assert_eq!(
            keys.manifest.as_ref(),
            "drains/ns/job/1234-abcd/03-work-out.manifest.json"
        );
        let root = object_keys(&Path::default(), &run(), 0, "/out", Compression::None);
        assert_eq!(root.archive.as_ref(), "ns/job/1234-abcd/00-out.tar");
    }

    #[test]
    fn a_later_attempts_keys_are_its_own_inside_the_runs_directory() {
        let p = Path::from("drains");
        let first = attempt_object_keys(&p, &run(), 1, 3, "/work/out", Compression::Zstd);
        assert_eq!(
            first,
            object_keys(&p, &run(), 3, "/work/out", Compression::Zstd)
        );
        let third = attempt_object_keys(&p, &run(), 3, 3, "/work/out", Compression::Zstd);
        assert_eq!(
            third.archive.as_ref(),
            "drains/ns/job/1234-abcd/attempt-3/03-work-out.tar.zst"
        );
        assert_eq!(
            third.manifest.as_ref(),
            "drains/ns/job/1234-abcd/attempt-3/03-work-out.manifest.json"
        );
        assert!(third
            .archive
            .as_ref()
            .starts_with(run_dir(&p, &run()).as_ref()));
        let cp = checkpoint_object_keys(&p, &run(), 2, 3, "/work/out", Compression::Zstd);
        assert_eq!(
            cp.manifest.as_ref(),
            "drains/ns/job/1234-abcd/checkpoint-2/03-work-out.manifest.json"
        );
    }
}
