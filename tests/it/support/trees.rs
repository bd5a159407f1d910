//! Directory trees on the host: built for a drain, snapshotted to compare with what came back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::write_pattern;

const MIB: u64 = 1024 * 1024;

/// Removes a (large) directory when the test ends, passed or failed: the disk is shared.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a tree holds, by relative path (directories without trailing `/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File { size: u64, sha256: String },
    Symlink(String),
}

/// The sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> String {
    let len = std::fs::metadata(path).expect("stat").len();
    if len >= 8 * MIB {
        // The test profile builds sha2 unoptimized; coreutils hashes a GiB in seconds.
        let out = Command::new("sha256sum")
            .arg(path)
            .output()
            .expect("sha256sum");
        assert!(out.status.success(), "sha256sum {}", path.display());
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .expect("sha256sum output")
            .to_string()
    } else {
        hex::encode(Sha256::digest(std::fs::read(path).expect("read")))
    }
}

/// What a tree holds, by relative path.
pub fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    for e in walkdir::WalkDir::new(root).min_depth(1).follow_links(false) {
        let e = e.expect("walk");
        let rel = e
            .path()
            .strip_prefix(root)
            .expect("under root")
            .to_string_lossy()
            .into_owned();
        let ft = e.file_type();
        let node = if ft.is_symlink() {
            Node::Symlink(
                std::fs::read_link(e.path())
                    .expect("readlink")
                    .to_string_lossy()
                    .into_owned(),
            )
        } else if ft.is_dir() {
            Node::Dir
        } else {
            Node::File {
                size: e.metadata().expect("stat").len(),
                sha256: sha256_file(e.path()),
            }
        };
        out.insert(rel, node);
    }
    out
}

/// A tree with nested and empty directories, in-tree symlinks, `small` small files and, when
/// `big` > 0, one large file.
pub fn make_tree(root: &Path, small: usize, big: u64) {
    std::fs::create_dir_all(root.join("a/b/c/d")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::create_dir_all(root.join("a/b/empty-too")).unwrap();
    std::fs::write(root.join("a/b/c/d/deep.txt"), b"deep\n").unwrap();
    for i in 0..small {
        let dir = root.join(format!("small/d{:02}", i % 40));
        std::fs::create_dir_all(&dir).unwrap();
        let len = (i * 37) % 3000;
        let body: Vec<u8> = (0..len).map(|j| (i + j * 7) as u8).collect();
        std::fs::write(dir.join(format!("f{i:04}.txt")), body).unwrap();
    }
    std::os::unix::fs::symlink("small/d00/f0000.txt", root.join("link-to-file")).unwrap();
    std::os::unix::fs::symlink("../../small", root.join("a/b/up-to-small")).unwrap();
    std::os::unix::fs::symlink("a/b/c", root.join("dir-link")).unwrap();
    if big > 0 {
        std::fs::create_dir_all(root.join("big")).unwrap();
        write_pattern(&root.join("big/blob.bin"), big, 42);
    }
}
