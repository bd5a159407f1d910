//! The drain end to end, on the real control plane and real object stores: a large mixed tree into
//! the S3 server and into a file:// store (re-extracted and verified against the source), hostile
//! tar streams from a packer under the test's control, the cap, an S3 outage, and an operator
//! restart mid-drain.
//!
//! Each test runs its own operator binary against its own namespace. kwok plays the node: its exec
//! runs the packer as a local process, so a declared "container path" is a host directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use object_store::ObjectStoreExt;
use sandboxrun_operator::api::{Compression, Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::files::extract_verified;
use sandboxrun_operator::store::{list_manifests, store_from_url, Manifest};
use sandboxrun_operator::tar::sanitize::MemberKind;

use crate::support::s3_server::PrivateS3;
use crate::support::*;

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;
const KIB: u64 = 1024;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn manifest_nodes(m: &Manifest) -> BTreeMap<String, Node> {
    m.members
        .iter()
        .map(|r| {
            let node = match r.kind {
                MemberKind::Dir => Node::Dir,
                MemberKind::File => Node::File {
                    size: r.size,
                    sha256: r.sha256.clone().expect("a file member has a sha256"),
                },
                MemberKind::Symlink => Node::Symlink(r.link_target.clone().expect("link target")),
            };
            (r.path.trim_end_matches('/').to_string(), node)
        })
        .collect()
}

/// Drains a tree into a store, then checks the store's copy against the source.
async fn drain_tree_and_verify(
    tag: &str,
    store_url: &str,
    options: Vec<(String, String)>,
    compression: Compression,
    big: u64,
) {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, tag).await;
    let op = Operator::builder(&ns.name, store_url)
        .store_options(&options)
        .start();
    let src = host_dir(tag);
    let _remove_src = RemoveOnDrop(src.clone());
    make_tree(&src, 2000, big);
    let want = snapshot(&src);

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // Over the default 1Gi cap: the GiB tree must be drained whole, not Capped.
    create(
        &runs,
        "tree",
        spec(&[&src])
            .size_limit("2Gi")
            .compression(compression)
            .drain_timeout("5m"),
    )
    .await;
    run_then_finish(&runs, &pods, "tree", &op).await;
    let run = wait_final(&runs, "tree", &op, Duration::from_secs(240)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}");
    assert_eq!(run.status.as_ref().unwrap().phase, Some(Phase::Succeeded));
    let want_bytes: u64 = want
        .values()
        .map(|n| match n {
            Node::File { size, .. } => *size,
            _ => 0,
        })
        .sum();
    assert_eq!(e.bytes, want_bytes, "{e:?}");
    assert_eq!(e.members, want.len() as u64, "{e:?}");
    assert_eq!((e.rejected_members, e.dropped_members), (0, 0), "{e:?}");

    let (store, prefix) = store_from_url(store_url, &options).expect("store");
    let manifests = list_manifests(&store, &prefix, &ns.name, "tree")
        .await
        .expect("list manifests");
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let manifest = &manifests[0].1;
    assert_eq!(manifest.compression, compression);
    assert_eq!(
        manifest_nodes(manifest),
        want,
        "the manifest lists the source tree"
    );
    assert!(
        manifest.archive_key.ends_with(compression.extension()),
        "{}",
        manifest.archive_key
    );

    let out = host_dir(&format!("{tag}-extracted"));
    let _remove_out = RemoveOnDrop(out.clone());
    let written = extract_verified(&store, manifest, &out)
        .await
        .expect("extract and verify");
    assert_eq!(written, want.len());
    assert_eq!(
        snapshot(&out),
        want,
        "the extracted tree is the source tree"
    );

    // Everything the drain stored is under the run's keys.
    let uid = run.uid().unwrap();
    let run_keys = format!(
        "{}/{uid}/",
        sandboxrun_operator::store::run_prefix(&prefix, &ns.name, "tree")
    );
    for key in keys_under(&store, &prefix).await {
        assert!(key.starts_with(&run_keys), "{key} is outside {run_keys}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A large mixed tree, into S3 and into a file:// store
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_gib_tree_drains_into_s3_and_extracts_to_the_same_bytes() {
    let s3 = s3();
    // Short names: s3s-fs keeps a multipart upload's metadata in a file named after the base64 of
    // the key plus the upload id, and a long key overflows NAME_MAX (255) on the server's disk —
    // a limit of the test bed, not of S3 (1024-byte keys).
    let url = format!("s3://{}/g{:04x}", s3.bucket, rand_u32() & 0xffff);
    drain_tree_and_verify("g", &url, s3.options(), Compression::None, GIB).await;
    // Leave nothing of the GiB behind on the S3 server's disk.
    let (store, prefix) = store_from_url(&url, &s3.options()).expect("store");
    for key in keys_under(&store, &prefix).await {
        let _ = store.delete(&key.as_str().into()).await;
    }
}

#[tokio::test]
async fn a_tree_drains_zstd_into_a_file_store_and_extracts_to_the_same_bytes() {
    let dir = host_dir("store-tree-file");
    let url = format!("file://{}", dir.display());
    drain_tree_and_verify("tree-file", &url, vec![], Compression::Zstd, 64 * MIB).await;
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// 2. Hostile streams
// ---------------------------------------------------------------------------------------------

/// Raw tar building, byte by byte, so the test can write what no honest packer writes.
mod craft {
    pub fn header(ty: u8, path: &[u8], link: Option<&[u8]>, size_field: u64) -> [u8; 512] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::new(ty));
        h.set_size(size_field);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        let b = h.as_mut_bytes();
        b[0..100].fill(0);
        b[..path.len()].copy_from_slice(path);
        if let Some(l) = link {
            b[157..157 + l.len()].copy_from_slice(l);
        }
        if ty == b'3' || ty == b'4' {
            // devmajor / devminor: /dev/null is 1,3.
            b[329..337].copy_from_slice(b"0000001\0");
            b[337..345].copy_from_slice(b"0000003\0");
        }
        h.set_cksum();
        *h.as_bytes()
    }

    pub fn pad(out: &mut Vec<u8>) {
        out.resize(out.len().div_ceil(512) * 512, 0);
    }

    pub fn entry(out: &mut Vec<u8>, ty: u8, path: &str, link: Option<&str>, data: &[u8]) {
        out.extend_from_slice(&header(
            ty,
            path.as_bytes(),
            link.map(str::as_bytes),
            data.len() as u64,
        ));
        out.extend_from_slice(data);
        pad(out);
    }

    pub fn pax_record(key: &str, value: &str) -> Vec<u8> {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        format!("{len}{body}").into_bytes()
    }

    pub fn pax(out: &mut Vec<u8>, records: &[u8]) {
        out.extend_from_slice(&header(b'x', b"PaxHeader", None, records.len() as u64));
        out.extend_from_slice(records);
        pad(out);
    }

    pub fn end(out: &mut Vec<u8>) {
        out.extend_from_slice(&[0u8; 1024]);
    }
}

/// The packer the hostile test's operator execs: the declared directory says what to send (its
/// `.mode` file), so one operator serves every case. Without `.mode` it is the real packer.
fn hostile_packer(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("hostile-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
# Hostile packer of tests/it/drain_e2e.rs. $1 is the declared path.
d="$1"
mode=real
[ -f "$d/.mode" ] && mode=$(cat "$d/.mode")
case "$mode" in
  stream) cat "$d/.stream"; exit 0 ;;
  fail) cat "$d/.stream"; echo "hostile packer refuses on purpose" >&2; exit 3 ;;
  zeros) cat /dev/zero; exit $? ;;
  yes) yes; exit $? ;;
  trickle) while :; do printf x; sleep 2; done ;;
  *) exec "{real}" pack "$d" ;;
esac
"#
    );
    std::fs::write(&script, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn hostile_dir(tag: &str, mode: &str, stream: Option<&[u8]>) -> PathBuf {
    let d = host_dir(tag);
    std::fs::write(d.join(".mode"), mode).unwrap();
    if let Some(s) = stream {
        std::fs::write(d.join(".stream"), s).unwrap();
    }
    d
}

/// Processes whose command line mentions `needle` (the test's own hostile script).
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// What the hostile packer does for one case (its `.mode`, and the bytes it sends).
enum Packer {
    /// Sends these bytes and exits 0.
    Stream(Vec<u8>),
    /// Sends these bytes, then fails (exit 3, with a message on stderr).
    Fail(Vec<u8>),
    /// `yes`: garbage forever.
    Yes,
    /// Zeros forever.
    Zeros,
    /// One byte every 2 s, forever: alive, but never 64 KiB within the idle bound.
    Trickle,
}

impl Packer {
    fn mode(&self) -> &'static str {
        match self {
            Packer::Stream(_) => "stream",
            Packer::Fail(_) => "fail",
            Packer::Yes => "yes",
            Packer::Zeros => "zeros",
            Packer::Trickle => "trickle",
        }
    }

    fn stream(&self) -> Option<&[u8]> {
        match self {
            Packer::Stream(s) | Packer::Fail(s) => Some(s),
            Packer::Yes | Packer::Zeros | Packer::Trickle => None,
        }
    }
}

/// What a hostile case must end in.
enum Hostile {
    /// Drained, the unsafe entries rejected and listed by reason, the rest stored and extracted.
    Sanitized {
        /// The stored members (sorted), which are also what `files get` extracts.
        stored: &'static [&'static str],
        /// (path, reason) of every rejected entry.
        rejected: Vec<(String, &'static str)>,
        /// `outer.bin`'s size: the PAX size wins over the ustar one.
        outer_size: u64,
    },
    /// Failed, the entry's message containing `says` (and one of `and_one_of`, when not
    /// empty), and nothing committed.
    Failed {
        says: &'static str,
        and_one_of: &'static [&'static str],
    },
    /// Committed with (phase, members stored, members dropped, entries rejected), extracted by
    /// `files get` and checked by `check`.
    Committed {
        phase: ReadBackPhase,
        members: u64,
        dropped: u64,
        rejected: u64,
        check: Extracted,
    },
}

/// What a committed hostile case's extracted copy must show.
enum Extracted {
    /// Every dropped member was over the metadata allowance, the archive stayed near the 1 MiB
    /// limit, and `result.txt` was kept.
    NameFlood,
    /// The last duplicate won, and `files ls` prints the control characters escaped.
    Duplicates,
    /// The member through the case-folded symlink is not written; the rest is.
    CaseFold,
}

/// One hostile stream: the run's name, its packer, its path's sizeLimit, what it must end in.
struct HostileCase {
    name: &'static str,
    packer: Packer,
    size_limit: Option<&'static str>,
    expect: Hostile,
}

/// The name-flood case: how many members, and the length of each one's (PAX) name.
const FLOOD_FILES: usize = 2000;
const FLOOD_NAME_BYTES: usize = 3968;

/// Every hostile case. `abs_target` is where an absolute-path entry would land if extracted
/// naively (a sentinel the test checks stays absent).
fn hostile_cases(abs_target: &Path) -> Vec<HostileCase> {
    // (a) Unsafe entries among good ones: rejected and listed, the good ones stored.
    let mut t = Vec::new();
    craft::entry(&mut t, b'5', "./", None, b"");
    craft::entry(&mut t, b'0', "ok.txt", None, b"fine\n");
    craft::entry(
        &mut t,
        b'0',
        &abs_target.display().to_string(),
        None,
        b"root",
    );
    craft::entry(&mut t, b'0', "../../escape.txt", None, b"up");
    craft::entry(&mut t, b'0', "sub/../../escape2.txt", None, b"up");
    craft::entry(&mut t, b'2', "abs-link", Some("/etc/passwd"), b"");
    craft::entry(&mut t, b'2', "up-link", Some("../../.."), b"");
    craft::entry(&mut t, b'5', "sub/", None, b"");
    craft::entry(&mut t, b'0', "sub/inner.txt", None, b"inner\n");
    craft::entry(&mut t, b'2', "through", Some("sub"), b"");
    craft::entry(&mut t, b'0', "through/smuggled.txt", None, b"via link");
    craft::entry(&mut t, b'1', "hard", Some("/etc/shadow"), b"");
    craft::entry(&mut t, b'3', "tty", None, b"");
    craft::entry(&mut t, b'4', "disk", None, b"");
    craft::entry(&mut t, b'6', "pipe", None, b"");
    // PAX path override pointing outside.
    craft::pax(&mut t, &craft::pax_record("path", "../pax-escape.txt"));
    craft::entry(&mut t, b'0', "innocent.txt", None, b"pax says otherwise");
    // TARmageddon desync: ustar size 0, PAX size N, content = a whole inner archive.
    let mut inner = Vec::new();
    craft::entry(&mut inner, b'0', "desync-smuggled.txt", None, b"evil");
    craft::pax(&mut t, &craft::pax_record("size", &inner.len().to_string()));
    t.extend_from_slice(&craft::header(b'0', b"outer.bin", None, 0));
    t.extend_from_slice(&inner);
    craft::pad(&mut t);
    craft::end(&mut t);
    let sanitized = t;

    // (b) A stream cut in the middle of a member (transient: retried until the drain timeout).
    let mut t = Vec::new();
    craft::entry(&mut t, b'0', "whole.txt", None, b"whole\n");
    craft::entry(&mut t, b'0', "cut.bin", None, &[7u8; 4096]);
    let cut = t.len() - 2048;
    t.truncate(cut);
    let truncated = t;

    // (c) Garbage.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let garbage: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();

    // (e) A valid archive from a packer that then exits non-zero.
    let mut t = Vec::new();
    craft::entry(
        &mut t,
        b'0',
        "looks-fine.txt",
        None,
        b"but the packer failed\n",
    );
    craft::end(&mut t);
    let failing = t;

    // (f) Junk after the end-of-archive marker.
    let mut t = Vec::new();
    craft::entry(&mut t, b'0', "a.txt", None, b"a\n");
    craft::end(&mut t);
    t.extend_from_slice(b"#!/bin/sh\nrm -rf /\n");
    let trailing = t;

    // (g) A flood of empty files with ~4 KiB names under `sizeLimit: 1Mi`: the names are metered
    // against the path's metadata allowance (1 MiB here), not stored without bound. (3968 bytes,
    // so that `files get` can still create them below the test's output directory: PATH_MAX.)
    let long_name = |i: usize| {
        let tail = format!("/f{i:06}");
        let mut name = vec!["d".repeat(250); 15].join("/");
        name.push_str(&tail);
        name.push_str(&"n".repeat(FLOOD_NAME_BYTES - name.len()));
        name
    };
    let mut t = Vec::new();
    craft::entry(&mut t, b'0', "result.txt", None, b"kept\n");
    for i in 0..FLOOD_FILES {
        craft::pax(&mut t, &craft::pax_record("path", &long_name(i)));
        craft::entry(&mut t, b'0', "placeholder", None, b"");
    }
    craft::end(&mut t);
    let name_flood = t;
    // result.txt costs 512 + 10 bytes of the allowance, each flood member 512 + its name.
    let kept_of_flood = ((1024 * 1024 - 522) / (512 + FLOOD_NAME_BYTES)) as u64;

    // (h) A GNU long name announcing a 2 GiB body (only its header is sent: the drain refuses
    // it before reading the body).
    let mut t = Vec::new();
    t.extend_from_slice(&craft::header(b'L', b"././@LongLink", None, 2 << 30));
    t.extend_from_slice(&[b'n'; 4096]);
    let huge_long_name = t;

    // (i) Duplicate members and a name with control characters: the last duplicate wins, the
    // path extracts, and `files ls` prints the name escaped.
    let mut t = Vec::new();
    craft::entry(&mut t, b'0', "same.txt", None, b"first\n");
    craft::entry(&mut t, b'0', "evil\x1b[2J\x07.txt", None, b"ctl\n");
    craft::entry(&mut t, b'0', "./same.txt", None, b"second\n");
    craft::end(&mut t);
    let duplicates = t;

    // (j) A member that folds onto a symlink: `LINK/x` is a path of its own on the pod's
    // filesystem, but on a case-insensitive one (macOS, Windows) it is `Link/x`, through the link.
    let mut t = Vec::new();
    craft::entry(&mut t, b'5', "sub/", None, b"");
    craft::entry(&mut t, b'2', "Link", Some("sub"), b"");
    craft::entry(&mut t, b'0', "LINK/x", None, b"through the link on APFS\n");
    craft::entry(&mut t, b'0', "ok.txt", None, b"ok\n");
    craft::end(&mut t);
    let case_fold = t;

    let failed = |says| Hostile::Failed {
        says,
        and_one_of: &[],
    };
    let case = |name, packer, expect| HostileCase {
        name,
        packer,
        size_limit: None,
        expect,
    };
    vec![
        case(
            "sanitized",
            Packer::Stream(sanitized),
            Hostile::Sanitized {
                stored: &["ok.txt", "outer.bin", "sub", "sub/inner.txt", "through"],
                // `innocent.txt` is the PAX-renamed entry: it is judged (and reported) by its
                // PAX path.
                rejected: vec![
                    (abs_target.display().to_string(), "absolute_path"),
                    ("../../escape.txt".into(), "parent_dir"),
                    ("sub/../../escape2.txt".into(), "parent_dir"),
                    ("abs-link".into(), "symlink_escape"),
                    ("up-link".into(), "symlink_escape"),
                    ("through/smuggled.txt".into(), "through_symlink"),
                    ("hard".into(), "hard_link"),
                    ("tty".into(), "device"),
                    ("disk".into(), "device"),
                    ("pipe".into(), "fifo"),
                    ("../pax-escape.txt".into(), "parent_dir"),
                ],
                outer_size: inner.len() as u64,
            },
        ),
        case("truncated", Packer::Stream(truncated), failed("truncated")),
        case("garbage", Packer::Stream(garbage), failed("malformed")),
        // (d) Endless streams: `yes` (garbage forever) and zeros forever (past the input bound).
        case("yes", Packer::Yes, failed("malformed")),
        HostileCase {
            size_limit: Some("1Mi"),
            ..case("zeros", Packer::Zeros, failed("input bytes"))
        },
        // (e) A packer that stays alive but trickles: cut off at the idle bound (the operator runs
        // this test with `--drain-idle-timeout 8s`), not held until the drain timeout.
        case("trickle", Packer::Trickle, failed("kept the drain waiting")),
        case(
            "exit-nonzero",
            Packer::Fail(failing),
            Hostile::Failed {
                says: "hostile packer refuses on purpose",
                and_one_of: &["exit code 3", "failed"],
            },
        ),
        case(
            "trailing",
            Packer::Stream(trailing),
            failed("end-of-archive"),
        ),
        HostileCase {
            size_limit: Some("1Mi"),
            ..case(
                "name-flood",
                Packer::Stream(name_flood),
                Hostile::Committed {
                    phase: ReadBackPhase::Capped,
                    members: kept_of_flood + 1,
                    dropped: FLOOD_FILES as u64 - kept_of_flood,
                    rejected: 0,
                    check: Extracted::NameFlood,
                },
            )
        },
        case(
            "long-name",
            Packer::Stream(huge_long_name),
            failed("GNU long name announces a 2147483648-byte body"),
        ),
        case(
            "duplicates",
            Packer::Stream(duplicates),
            Hostile::Committed {
                phase: ReadBackPhase::Drained,
                members: 3,
                dropped: 0,
                rejected: 0,
                check: Extracted::Duplicates,
            },
        ),
        case(
            "case-fold",
            Packer::Stream(case_fold),
            Hostile::Committed {
                phase: ReadBackPhase::Drained,
                members: 4,
                dropped: 0,
                rejected: 0,
                check: Extracted::CaseFold,
            },
        ),
    ]
}

/// Asserts what `case` must end in, given its final run; `store_url` and `namespace` say where
/// its archive is.
async fn assert_hostile(case: &HostileCase, run: &SandboxRun, store_url: &str, namespace: &str) {
    let name = case.name;
    let e = read_back(run, 0);
    let (store, prefix) = store_from_url(store_url, &[]).unwrap();
    let m = list_manifests(&store, &prefix, namespace, name)
        .await
        .unwrap();
    match &case.expect {
        Hostile::Sanitized {
            stored: want_stored,
            rejected,
            outer_size,
        } => {
            assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}");
            assert_eq!(e.rejected_members, rejected.len() as u64, "{e:?}");
            assert_eq!(m.len(), 1);
            let manifest = &m[0].1;
            let mut stored: Vec<&str> = manifest.members.iter().map(|m| m.path.as_str()).collect();
            stored.sort();
            assert_eq!(stored, *want_stored, "{manifest:?}");
            let outer = manifest
                .members
                .iter()
                .find(|m| m.path == "outer.bin")
                .unwrap();
            assert_eq!(
                outer.size, *outer_size,
                "the PAX size wins; nothing smuggled"
            );
            let mut reasons: Vec<(String, String)> = manifest
                .rejected
                .iter()
                .map(|r| (r.path.clone(), r.reason.as_str().to_string()))
                .collect();
            reasons.sort();
            let mut want: Vec<(String, String)> = rejected
                .iter()
                .map(|(p, r)| (p.clone(), r.to_string()))
                .collect();
            want.sort();
            assert_eq!(reasons, want);
            let out = host_dir("hostile-extracted");
            extract_verified(&store, manifest, &out)
                .await
                .expect("the stored archive extracts cleanly");
            let mut got: Vec<String> = snapshot(&out).into_keys().collect();
            got.sort();
            assert_eq!(got, *want_stored);
            assert!(!out.parent().unwrap().join("pax-escape.txt").exists());
            assert!(!out.join("sub/smuggled.txt").exists());
        }
        Hostile::Failed { says, and_one_of } => {
            assert_eq!(e.phase, ReadBackPhase::Failed, "{name}: {e:?}");
            let msg = e.message.clone().unwrap_or_default();
            assert!(
                msg.contains(says),
                "{name}: message {msg:?} should say {says:?}"
            );
            assert!(
                and_one_of.is_empty() || and_one_of.iter().any(|s| msg.contains(s)),
                "{name}: message {msg:?} should say one of {and_one_of:?}"
            );
            assert!(
                m.is_empty(),
                "{name}: a failed drain commits nothing: {m:?}"
            );
        }
        Hostile::Committed {
            phase,
            members,
            dropped,
            rejected,
            check,
        } => {
            assert_eq!(
                (e.phase, e.members, e.dropped_members, e.rejected_members),
                (*phase, *members, *dropped, *rejected),
                "{name}: {e:?}"
            );
            let manifest = &m[0].1;
            let out = host_dir(&format!("hostile-extracted-{name}"));
            extract_verified(&store, manifest, &out)
                .await
                .unwrap_or_else(|e| panic!("{name}: files get: {e}"));
            match check {
                Extracted::NameFlood => {
                    assert!(manifest
                        .dropped
                        .iter()
                        .all(|d| d.reason == "over_metadata_allowance"));
                    assert!(
                        manifest.totals.archive_bytes <= 2 * 1024 * 1024 + 64 * 1024,
                        "{name}: the store holds {} archive bytes for a 1Mi path",
                        manifest.totals.archive_bytes
                    );
                    assert_eq!(std::fs::read(out.join("result.txt")).unwrap(), b"kept\n");
                }
                Extracted::CaseFold => {
                    // `files get` neutralizes it: not written, the rest extracted.
                    assert!(!out.join("LINK").exists());
                    assert!(!out.join("sub/x").exists());
                    assert_eq!(std::fs::read(out.join("ok.txt")).unwrap(), b"ok\n");
                }
                Extracted::Duplicates => {
                    assert_eq!(std::fs::read(out.join("same.txt")).unwrap(), b"second\n");
                    let mut listing = Vec::new();
                    let args = sandboxrun_operator::files::FilesArgs {
                        command: sandboxrun_operator::files::FilesCommand::Ls { run: name.into() },
                        store: sandboxrun_operator::files::FilesStoreArgs {
                            store_url: Some(store_url.to_string()),
                            store_options: Default::default(),
                        },
                        cluster: sandboxrun_operator::plugin::cluster::ClusterArgs {
                            namespace: Some(namespace.to_string()),
                            ..Default::default()
                        },
                        uid: None,
                        attempt: None,
                        checkpoint: None,
                    };
                    sandboxrun_operator::files::run_to(args, &mut listing)
                        .await
                        .expect("files ls");
                    let text = String::from_utf8(listing).unwrap();
                    assert!(text.contains("evil\\x1b[2J\\x07.txt"), "{text}");
                    assert!(!text.contains('\x1b'), "{text:?}");
                }
            }
        }
    }
}

#[tokio::test]
async fn hostile_streams_are_sanitized_or_fail_loudly_and_the_operator_keeps_serving() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "hostile").await;
    let store_dir = host_dir("store-hostile");
    let store_url = format!("file://{}", store_dir.display());
    let bin = host_dir("hostile-bin");
    let script = hostile_packer(&bin);
    let pack = format!("{} ", script.display());
    let mut op = Operator::builder(&ns.name, &store_url)
        .flags(&["--pack-command", &pack, "--drain-idle-timeout", "8s"])
        .start();

    // Sentinels: where an escaping entry would land if anyone extracted it naively.
    let sentinel = host_dir("hostile-sentinel");
    let abs_target = sentinel.join("abs-pwned");
    let cases = hostile_cases(&abs_target);

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for case in &cases {
        let dir = hostile_dir(
            &format!("h-{}", case.name),
            case.packer.mode(),
            case.packer.stream(),
        );
        let mut s = spec(&[&dir]).drain_timeout("20s");
        if let Some(limit) = case.size_limit {
            s = s.size_limit(limit);
        }
        create(&runs, case.name, s).await;
    }
    for case in &cases {
        run_then_finish(&runs, &pods, case.name, &op).await;
    }
    let mut finals = BTreeMap::new();
    for case in &cases {
        let run = wait_final(&runs, case.name, &op, Duration::from_secs(120)).await;
        finals.insert(case.name, run);
    }

    for case in &cases {
        assert_hostile(case, &finals[case.name], &store_url, &ns.name).await;
    }
    assert!(
        !abs_target.exists(),
        "nothing was written at the absolute path"
    );

    // Nothing in the store outside the runs' own keys; failed drains left no archive.
    let (store, _) = store_from_url(&store_url, &[]).unwrap();
    let mut allowed: Vec<String> = Vec::new();
    for (name, run) in &finals {
        allowed.push(format!("{}/{name}/{}/", ns.name, run.uid().unwrap()));
    }
    let committed: Vec<String> = cases
        .iter()
        .filter(|c| !matches!(c.expect, Hostile::Failed { .. }))
        .map(|c| format!("/{}/", c.name))
        .collect();
    for key in keys_under(&store, &object_store::path::Path::default()).await {
        assert!(
            allowed.iter().any(|a| key.starts_with(a)),
            "{key} is outside every run's keys {allowed:?}"
        );
        assert!(
            committed.iter().any(|c| key.contains(c.as_str())),
            "only the runs expected to commit did: {key}"
        );
    }

    // The operator survived all of it, and still serves a normal run.
    assert!(op.is_alive(), "operator died; log:\n{}", op.log_text());
    let normal = host_dir("h-normal");
    std::fs::write(normal.join("report.txt"), b"still serving\n").unwrap();
    create(
        &runs,
        "normal",
        spec(&[&normal]).compression(Compression::Gzip),
    )
    .await;
    run_then_finish(&runs, &pods, "normal", &op).await;
    let run = wait_final(&runs, "normal", &op, Duration::from_secs(90)).await;
    assert_eq!(
        read_back(&run, 0).phase,
        ReadBackPhase::Drained,
        "{:?}",
        read_back(&run, 0)
    );
    assert!(op.is_alive());

    // No packer of ours is left running (the endless ones were cut off).
    // (The operator's own command line names the script too: its --pack-command.)
    let needle = script.display().to_string();
    let op_pid = op.pid();
    let left = || {
        processes_mentioning(&needle)
            .into_iter()
            .filter(|p| *p != op_pid)
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
            })
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !left().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        left(),
        Vec::<String>::new(),
        "hostile packers still running"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The cap
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_path_over_its_cap_drops_one_member_and_keeps_the_rest() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "cap").await;
    let store_dir = host_dir("store-cap");
    let store_url = format!("file://{}", store_dir.display());
    let op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("cap");
    write_pattern(&out.join("a.bin"), 600 * KIB, 1);
    write_pattern(&out.join("b.bin"), 600 * KIB, 2);
    write_pattern(&out.join("c.bin"), 100 * KIB, 3);
    let want = snapshot(&out);

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "capped",
        spec(&[&out]).size_limit("1Mi").drain_timeout("60s"),
    )
    .await;
    run_then_finish(&runs, &pods, "capped", &op).await;
    let run = wait_final(&runs, "capped", &op, Duration::from_secs(90)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Capped, "{e:?}");
    assert_eq!(e.dropped_members, 1, "{e:?}");
    assert_eq!(e.bytes, 700 * KIB, "{e:?}");
    assert!(
        e.message.as_deref().unwrap_or_default().contains("cap"),
        "{e:?}"
    );

    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let m = list_manifests(&store, &prefix, &ns.name, "capped")
        .await
        .unwrap();
    let manifest = &m[0].1;
    assert_eq!(manifest.dropped.len(), 1);
    assert_eq!(
        (manifest.dropped[0].path.as_str(), manifest.dropped[0].size),
        ("b.bin", 600 * KIB),
        "the member that would cross the cap is dropped whole"
    );
    let extracted = host_dir("cap-extracted");
    extract_verified(&store, manifest, &extracted)
        .await
        .expect("extract");
    let got = snapshot(&extracted);
    assert_eq!(got.len(), 2);
    for name in ["a.bin", "c.bin"] {
        assert_eq!(got.get(name), want.get(name), "{name} intact");
    }
    assert!(!got.contains_key("b.bin"));

    let ev = wait_event(
        &client,
        &ns.name,
        None,
        "sandbox_runfiles_readback_capped",
        Duration::from_secs(30),
        &op,
    )
    .await;
    assert!(ev.note.unwrap_or_default().contains("1 member(s) dropped"));
}

/// The packer of the parallel-paths test: it marks its path as started, waits (up to 15 s) for
/// the path named in `.peer` to be started too, writes what it saw into `saw-peer`, then packs.
/// Drained one after the other, the first path's packer gives up waiting and writes `no`.
fn rendezvous_packer(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("rendezvous-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
d="$1"; shift
peer=$(cat "$d/.peer")
: > "$d.started"
i=0
while [ ! -e "$peer.started" ] && [ "$i" -lt 150 ]; do sleep 0.1; i=$((i+1)); done
if [ -e "$peer.started" ]; then echo yes > "$d/saw-peer"; else echo no > "$d/saw-peer"; fi
exec "{real}" pack "$d" "$@"
"#
    );
    std::fs::write(&script, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Drains a run of two paths through the rendezvous packer under `flags`, and returns what each
/// path's packer saw of the other (the `saw-peer` file of each stored archive).
async fn saw_peer_when_draining_two_paths(tag: &str, flags: &[&str]) -> Vec<String> {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, tag).await;
    let store_dir = host_dir(&format!("store-{tag}"));
    let store_url = format!("file://{}", store_dir.display());
    let bin = host_dir(&format!("{tag}-bin"));
    let pack = format!("{} ", rendezvous_packer(&bin).display());
    let mut all = vec!["--pack-command", pack.as_str()];
    all.extend_from_slice(flags);
    let op = Operator::builder(&ns.name, &store_url).flags(&all).start();
    let a = host_dir(&format!("{tag}-a"));
    let b = host_dir(&format!("{tag}-b"));
    std::fs::write(a.join(".peer"), b.display().to_string()).unwrap();
    std::fs::write(b.join(".peer"), a.display().to_string()).unwrap();

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "two", spec(&[&a, &b]).drain_timeout("120s")).await;
    run_then_finish(&runs, &pods, "two", &op).await;
    let run = wait_final(&runs, "two", &op, Duration::from_secs(150)).await;
    for i in 0..2 {
        assert_eq!(read_back(&run, i).phase, ReadBackPhase::Drained, "{run:?}");
    }
    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let manifests = list_manifests(&store, &prefix, &ns.name, "two")
        .await
        .unwrap();
    assert_eq!(manifests.len(), 2, "one manifest per path");
    let mut saw = Vec::new();
    for (i, (_, manifest)) in manifests.iter().enumerate() {
        let out = host_dir(&format!("{tag}-extracted-{i}"));
        extract_verified(&store, manifest, &out)
            .await
            .expect("extract");
        saw.push(
            std::fs::read_to_string(out.join("saw-peer"))
                .unwrap()
                .trim()
                .to_string(),
        );
    }
    saw.sort();
    saw
}

/// Issue #15 item 3: the declared paths of a run drain in parallel — each path's packer sees the
/// other's started — and `--max-concurrent-path-drains` bounds them: with one slot, the first
/// path's packer waits for a peer that never comes.
#[tokio::test]
async fn the_paths_of_a_run_drain_in_parallel_up_to_the_path_slots() {
    let parallel = saw_peer_when_draining_two_paths("par", &[]).await;
    assert_eq!(parallel, ["yes", "yes"], "both packers ran at once");
    let one_slot =
        saw_peer_when_draining_two_paths("par1", &["--max-concurrent-path-drains", "1"]).await;
    assert_eq!(
        one_slot,
        ["no", "yes"],
        "one slot: the paths drained one after the other"
    );
}

/// Issue #10: a 64 GiB sparse file next to a 10-byte result, under a 1Mi cap. The packer gets the
/// cap as `--budget` and sends the big file as a zero-length placeholder, so nothing of it crosses
/// the wire: the path ends Capped (not Failed after 260 MiB of zeros), the result is kept, and the
/// drain takes seconds.
#[tokio::test]
async fn a_huge_sparse_file_is_dropped_in_the_pod_and_the_small_result_is_kept_in_seconds() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "sparse").await;
    let store_dir = host_dir("store-sparse");
    let _remove_store = RemoveOnDrop(store_dir.clone());
    let store_url = format!("file://{}", store_dir.display());
    let op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("sparse");
    let _remove_out = RemoveOnDrop(out.clone());
    // Sparse: 64 GiB long, not one block on disk.
    let huge = std::fs::File::create(out.join("huge.bin")).unwrap();
    huge.set_len(64 * GIB).unwrap();
    drop(huge);
    let result = b"answer=42\n";
    assert_eq!(result.len(), 10);
    std::fs::write(out.join("result.txt"), result).unwrap();

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "sparse",
        spec(&[&out]).size_limit("1Mi").drain_timeout("2m"),
    )
    .await;
    run_then_finish(&runs, &pods, "sparse", &op).await;
    let run = wait_final(&runs, "sparse", &op, Duration::from_secs(120)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Capped, "{e:?}");
    assert_eq!((e.members, e.bytes, e.dropped_members), (1, 10, 1), "{e:?}");
    assert!(
        e.message.as_deref().unwrap_or_default().contains("cap"),
        "{e:?}"
    );
    assert_eq!(e.attempts, 1, "no retry, no fallback: {e:?}");
    assert_eq!(
        run.status.as_ref().unwrap().phase,
        Some(Phase::Succeeded),
        "a capped path is not a failed run"
    );

    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let m = list_manifests(&store, &prefix, &ns.name, "sparse")
        .await
        .unwrap();
    assert_eq!(m.len(), 1, "{m:?}");
    let manifest = &m[0].1;
    assert_eq!(manifest.phase, ReadBackPhase::Capped);
    assert_eq!(manifest.dropped.len(), 1, "{manifest:?}");
    let dropped = &manifest.dropped[0];
    assert_eq!(
        (
            dropped.path.as_str(),
            dropped.size,
            dropped.reason.as_str(),
            dropped.in_pod
        ),
        ("huge.bin", 64 * GIB, "over_cap", true),
        "dropped in the pod, listed with its real size"
    );
    assert_eq!(manifest.stopped_at_input_bound, None, "{manifest:?}");
    assert!(
        manifest.totals.input_bytes < 64 * KIB,
        "only headers and the result crossed the wire: {} bytes",
        manifest.totals.input_bytes
    );
    let names: Vec<&str> = manifest.members.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(names, ["result.txt"]);
    let started: jiff::Timestamp = manifest.started_at.parse().unwrap();
    let finished: jiff::Timestamp = manifest.finished_at.parse().unwrap();
    let took = finished.duration_since(started);
    assert!(
        took < jiff::SignedDuration::from_secs(10),
        "the drain took {took:?}"
    );

    // `files get`: the result is there, byte for byte, and the placeholder is not a file.
    let extracted = host_dir("sparse-extracted");
    let _remove_extracted = RemoveOnDrop(extracted.clone());
    extract_verified(&store, manifest, &extracted)
        .await
        .expect("extract");
    assert_eq!(std::fs::read(extracted.join("result.txt")).unwrap(), result);
    assert!(!extracted.join("huge.bin").exists());

    let ev = wait_event(
        &client,
        &ns.name,
        None,
        "sandbox_runfiles_readback_capped",
        Duration::from_secs(30),
        &op,
    )
    .await;
    assert!(ev.note.unwrap_or_default().contains("1 member(s) dropped"));
}

// ---------------------------------------------------------------------------------------------
// 4. S3 outage
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_s3_outage_during_the_drain_is_retried_until_the_path_is_drained() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "s3-back").await;
    let mut s3 = PrivateS3::new("back");
    let op = Operator::builder(&ns.name, &s3.url())
        .store_options(&s3.options())
        .start();
    let out = host_dir("s3-back");
    make_tree(&out, 50, 8 * MIB);
    let want = snapshot(&out);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "outage",
        spec(&[&out])
            .compression(Compression::Zstd)
            .drain_timeout("90s"),
    )
    .await;
    let run = wait_phase(&runs, "outage", Phase::Running, &op).await;

    s3.stop();
    finish_workload(&pods, &pod_of(&run), 0).await;
    wait_phase(&runs, "outage", Phase::Draining, &op).await;
    // Let the drain run into the outage for a while (a delay, not an assertion).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = runs.get("outage").await.unwrap();
    assert_eq!(
        read_back(&during, 0).phase,
        ReadBackPhase::Pending,
        "no store, so nothing can have been committed yet"
    );
    s3.start();

    let run = wait_final(&runs, "outage", &op, Duration::from_secs(150)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}");
    assert_eq!(run.status.as_ref().unwrap().phase, Some(Phase::Succeeded));
    let (store, prefix) = store_from_url(&s3.url(), &s3.options()).unwrap();
    let m = list_manifests(&store, &prefix, &ns.name, "outage")
        .await
        .unwrap();
    assert_eq!(m.len(), 1);
    let extracted = host_dir("s3-back-extracted");
    extract_verified(&store, &m[0].1, &extracted)
        .await
        .expect("extract");
    assert_eq!(snapshot(&extracted), want);
    let keys = keys_under(&store, &prefix).await;
    assert_eq!(keys.len(), 2, "one archive and one manifest: {keys:?}");
    let _ = std::fs::remove_dir_all(&extracted);
}

#[tokio::test]
async fn an_s3_outage_that_lasts_fails_the_drain_loudly_and_never_blocks_deletion() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "s3-down").await;
    let mut s3 = PrivateS3::new("down");
    let op = Operator::builder(&ns.name, &s3.url())
        .store_options(&s3.options())
        .start();
    let out = host_dir("s3-down");
    std::fs::write(out.join("result.json"), b"{\"ok\":true}\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // A batch run that ends, and a long-lived one that is deleted, both while S3 is down.
    create(&runs, "ends", spec(&[&out]).drain_timeout("15s")).await;
    create(
        &runs,
        "deleted",
        spec(&[&out]).drain_timeout("15s").command(None),
    )
    .await;
    let ends = wait_phase(&runs, "ends", Phase::Running, &op).await;
    wait_phase(&runs, "deleted", Phase::Running, &op).await;
    s3.stop();
    finish_workload(&pods, &pod_of(&ends), 0).await;
    runs.delete("deleted", &DeleteParams::default())
        .await
        .unwrap();

    let run = wait_final(&runs, "ends", &op, Duration::from_secs(90)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Failed, "{e:?}");
    assert!(
        e.message
            .as_deref()
            .unwrap_or_default()
            .contains("drain timeout"),
        "{e:?}"
    );
    let describe = eventually_or_log(
        "kubectl describe to show the drain_failed Event",
        Duration::from_secs(30),
        &op,
        || {
            let ns = ns.name.clone();
            async move {
                let out = Command::new(kubectl_path())
                    .args(["--kubeconfig", &kubeconfig_path().display().to_string()])
                    .args(["describe", "sbr", "ends", "-n", &ns])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.contains("sandbox_runfiles_drain_failed")
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(describe.contains("Warning"), "{describe}");

    // The deleted run goes away once its drain has failed (drainTimeout 15s), never stuck on the
    // finalizer.
    wait_gone(&runs, "deleted", &op, Duration::from_secs(75)).await;
}

// ---------------------------------------------------------------------------------------------
// 5. Restart mid-drain
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_operator_killed_mid_drain_is_replaced_and_the_path_drains_once() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "restart").await;
    let store_dir = host_dir("store-restart");
    let store_url = format!("file://{}", store_dir.display());
    let mut op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("restart");
    let _remove_out = RemoveOnDrop(out.clone());
    let _remove_store = RemoveOnDrop(store_dir.clone());
    make_tree(&out, 20, 384 * MIB);
    let want = snapshot(&out);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "restart", spec(&[&out]).drain_timeout("5m")).await;
    run_then_finish(&runs, &pods, "restart", &op).await;
    wait_phase(&runs, "restart", Phase::Draining, &op).await;
    // Kill it once the archive is being written (a part of it is on the store's disk).
    let store_for_wait = store_dir.clone();
    eventually("the drain to be under way", Duration::from_secs(60), || {
        let dir = store_for_wait.clone();
        async move {
            let any = walkdir::WalkDir::new(&dir)
                .into_iter()
                .filter_map(Result::ok)
                .any(|e| e.file_type().is_file() && e.metadata().map(|m| m.len()).unwrap_or(0) > 0);
            any.then_some(())
        }
    })
    .await;
    let mid = runs.get("restart").await.unwrap();
    op.kill();
    assert_eq!(
        read_back(&mid, 0).phase,
        ReadBackPhase::Pending,
        "killed before the commit"
    );

    let op2 = Operator::builder(&ns.name, &store_url).start();
    let run = wait_final(&runs, "restart", &op2, Duration::from_secs(240)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}");
    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    let m = list_manifests(&store, &prefix, &ns.name, "restart")
        .await
        .unwrap();
    assert_eq!(m.len(), 1, "one commit");
    let keys = keys_under(&store, &object_store::path::Path::default()).await;
    assert_eq!(
        keys.len(),
        2,
        "one archive and one manifest, nothing duplicated: {keys:?}"
    );
    let extracted = host_dir("restart-extracted");
    extract_verified(&store, &m[0].1, &extracted)
        .await
        .expect("extract");
    assert_eq!(snapshot(&extracted), want);
    let _ = std::fs::remove_dir_all(&extracted);
}
