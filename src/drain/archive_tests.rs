//! Tests of the streaming drain ([`super::archive`], [`super::pipeline`]): hostile
//! archives, the cap, the input bound, the store commit.

use super::archive::*;
use crate::api::{Compression, ReadBackPhase};
use crate::caps as cap;
use crate::drain::options::*;
use crate::identity::RunId;
use crate::store::manifest::DrainOutcome;
use crate::store::manifest::{
    DroppedRecord, DROPPED_INPUT_BOUND, DROPPED_METADATA, DROPPED_OVER_CAP,
};
use crate::store::{object_keys, store_from_url};
use crate::store::{Manifest, ManifestContext};
use crate::tar::sanitize::Reason;
use crate::tar::ustar;
use object_store::ObjectStoreExt;
use sha2::Digest;
use sha2::Sha256;
use std::io;
use std::io::Read as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::ReadBuf;

/// Appends one entry with raw header fields (no validation: hostile archives are the point).
fn raw_entry(out: &mut Vec<u8>, ty: u8, path: &str, link: Option<&str>, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::new(ty));
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    let pax = ustar::fill(
        h.as_mut_bytes(),
        path.as_bytes(),
        link.map(str::as_bytes),
        data.len() as u64,
    );
    if !pax.is_empty() {
        pax_entry(out, &pax);
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn pax_entry(out: &mut Vec<u8>, records: &[u8]) {
    let mut x = tar::Header::new_ustar();
    x.set_entry_type(tar::EntryType::XHeader);
    x.set_size(records.len() as u64);
    x.set_mode(0o644);
    ustar::fill(x.as_mut_bytes(), b"PaxHeader", None, records.len() as u64);
    x.set_cksum();
    out.extend_from_slice(x.as_bytes());
    out.extend_from_slice(records);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0u8; 1024]);
}

fn sample() -> Vec<u8> {
    let mut t = Vec::new();
    raw_entry(&mut t, b'5', "./", None, b"");
    raw_entry(&mut t, b'5', "a/", None, b"");
    raw_entry(&mut t, b'0', "a/b.txt", None, b"hello");
    raw_entry(&mut t, b'2', "l", Some("a/b.txt"), b"");
    raw_entry(&mut t, b'0', "z.txt", None, b"zz");
    end(&mut t);
    t
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

async fn drain(input: &[u8], opts: &DrainOptions) -> Result<(DrainOutcome, Vec<u8>), DrainError> {
    let mut out = Vec::new();
    let outcome = drain_stream(input, &mut out, opts).await?;
    Ok((outcome, out))
}

async fn decompress(bytes: &[u8], compression: Compression) -> Vec<u8> {
    use async_compression::tokio::bufread::{GzipDecoder, ZstdDecoder};
    let mut out = Vec::new();
    match compression {
        Compression::None => out.extend_from_slice(bytes),
        Compression::Gzip => {
            GzipDecoder::new(bytes)
                .read_to_end(&mut out)
                .await
                .expect("gunzip");
        }
        Compression::Zstd => {
            ZstdDecoder::new(bytes)
                .read_to_end(&mut out)
                .await
                .expect("unzstd");
        }
    }
    out
}

/// (path, type flag, content, link target) of every member, read by the `tar` crate.
fn members_of(archive: &[u8]) -> Vec<(String, u8, Vec<u8>, Option<String>)> {
    let mut ar = tar::Archive::new(archive);
    let mut out = Vec::new();
    for e in ar.entries().expect("entries") {
        let mut e = e.expect("entry");
        let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let ty = e.header().entry_type().as_byte();
        let link = e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned());
        let mut data = Vec::new();
        e.read_to_end(&mut data).expect("content");
        out.push((path, ty, data, link));
    }
    out
}

fn opts(cap: u64) -> DrainOptions {
    DrainOptions::new(cap, Compression::None)
}

#[tokio::test]
async fn accepted_members_are_re_emitted_with_their_sha256() {
    for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
        let o = DrainOptions::new(1024, compression);
        let (outcome, out) = drain(&sample(), &o).await.expect("drain");
        let paths: Vec<_> = outcome.members.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b.txt", "l", "z.txt"]);
        assert_eq!(
            outcome.members[1].sha256.as_deref(),
            Some(sha(b"hello").as_str())
        );
        assert_eq!(outcome.members[2].link_target.as_deref(), Some("a/b.txt"));
        assert_eq!(outcome.bytes, 7);
        assert_eq!(outcome.input_bytes, sample().len() as u64);
        assert_eq!(outcome.archive_bytes, out.len() as u64);
        assert_eq!(outcome.phase(), ReadBackPhase::Drained);
        let stored = members_of(&decompress(&out, compression).await);
        let names: Vec<_> = stored.iter().map(|m| m.0.as_str()).collect();
        assert_eq!(names, ["a/", "a/b.txt", "l", "z.txt"], "{compression:?}");
        assert_eq!(stored[1].2, b"hello");
        assert_eq!(
            sha(&stored[3].2),
            outcome.members[3].sha256.clone().unwrap_or_default()
        );
        assert_eq!(
            (stored[2].1, stored[2].3.as_deref()),
            (b'2', Some("a/b.txt"))
        );
    }
}

#[tokio::test]
async fn an_empty_directory_drains_to_an_empty_set_with_phase_empty() {
    let mut t = Vec::new();
    end(&mut t);
    let (outcome, out) = drain(&t, &opts(10)).await.expect("drain");
    assert_eq!(outcome.phase(), ReadBackPhase::Empty);
    assert!(members_of(&out).is_empty());
}

#[tokio::test]
async fn member_over_cap_is_dropped_and_the_rest_is_kept() {
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "big", None, &[1u8; 8]);
    raw_entry(&mut t, b'0', "huge", None, &[2u8; 5]);
    raw_entry(&mut t, b'0', "small", None, &[3u8; 2]);
    end(&mut t);
    let (outcome, out) = drain(&t, &opts(10)).await.expect("drain");
    let kept: Vec<_> = members_of(&out).into_iter().map(|m| (m.0, m.2)).collect();
    assert_eq!(
        kept,
        vec![("big".into(), vec![1u8; 8]), ("small".into(), vec![3u8; 2])]
    );
    assert_eq!(
        outcome.dropped,
        vec![DroppedRecord {
            path: "huge".into(),
            size: 5,
            reason: "over_cap".into(),
            in_pod: false,
        }]
    );
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    assert_eq!(outcome.bytes, 10);
}

#[tokio::test]
async fn unsafe_entries_are_rejected_listed_and_never_stored() {
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "/etc/passwd", None, b"root");
    raw_entry(&mut t, b'0', "../escape", None, b"x");
    raw_entry(&mut t, b'1', "hard", Some("/etc/shadow"), b"");
    raw_entry(&mut t, b'6', "pipe", None, b"");
    raw_entry(&mut t, b'3', "tty", None, b"");
    raw_entry(&mut t, b'2', "up", Some("../.."), b"");
    raw_entry(&mut t, b'2', "out", Some("sub"), b"");
    raw_entry(&mut t, b'0', "out/through", None, b"pwned");
    raw_entry(&mut t, b'0', "ok.txt", None, b"fine");
    end(&mut t);
    let (outcome, out) = drain(&t, &opts(1024)).await.expect("drain");
    let reasons: Vec<_> = outcome
        .rejected
        .iter()
        .map(|r| (r.path.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("/etc/passwd", "absolute_path"),
            ("../escape", "parent_dir"),
            ("hard", "hard_link"),
            ("pipe", "fifo"),
            ("tty", "device"),
            ("up", "symlink_escape"),
            ("out/through", "through_symlink"),
        ]
    );
    let names: Vec<_> = members_of(&out).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["out", "ok.txt"]);
}

#[tokio::test]
async fn truncated_stream_is_an_error_not_an_empty_set() {
    let full = sample();
    let header_of_z = full.len() - 1024 - 1024; // "z.txt" header + one content block
    for cut in [
        0,
        100,
        512 + 300,
        header_of_z,
        header_of_z + 512 + 1,
        full.len() - 1024,
    ] {
        let err = drain(&full[..cut], &opts(1024)).await.err();
        match err {
            Some(DrainError {
                kind: DrainErrorKind::Truncated(_),
                ..
            }) => {}
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_error_says_how_far_the_drain_got() {
    let full = sample();
    let cut = full.len() - 1024 - 1024 + 512 + 1; // inside z.txt's content
    let err = drain(&full[..cut], &opts(1024))
        .await
        .expect_err("must fail");
    assert_eq!(err.progress.members, 3, "a/, a/b.txt and l were re-emitted");
    assert_eq!(err.progress.input_bytes, cut as u64);
    assert_eq!(err.metric_label(), "truncated");
    let text = err.to_string();
    assert!(
        text.contains("3 members") && text.contains("z.txt"),
        "{text}"
    );
}

#[tokio::test]
async fn garbage_bytes_are_an_error() {
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let err = drain(&garbage, &opts(1024)).await.expect_err("must fail");
    assert!(matches!(err.kind, DrainErrorKind::Malformed(_)), "{err}");
}

#[tokio::test]
async fn bytes_after_the_end_marker_must_be_zero_padding() {
    let mut padded = sample();
    padded.extend_from_slice(&[0u8; 8192]);
    drain(&padded, &opts(1024))
        .await
        .expect("zero padding is fine");
    let mut junk = sample();
    junk.extend_from_slice(b"#!/bin/sh\n");
    let err = drain(&junk, &opts(1024)).await.expect_err("must fail");
    assert!(matches!(err.kind, DrainErrorKind::TrailingGarbage), "{err}");
}

/// A header announcing a huge file, then zeros forever.
struct Endless {
    header: Vec<u8>,
    pos: usize,
}

impl AsyncRead for Endless {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.header.len() {
            let n = (self.header.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.header[start..start + n]);
            self.pos += n;
        } else {
            let n = buf.remaining().min(4096);
            buf.put_slice(&vec![0u8; n]);
        }
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn an_endless_member_stops_the_drain_at_the_input_bound_and_keeps_what_came_before() {
    // a.txt, then a header announcing 1 TiB, then zeros forever (an old packer streaming a
    // huge sparse file, or a hostile one).
    let mut head = Vec::new();
    raw_entry(&mut head, b'0', "a.txt", None, b"kept\n");
    let mut h = tar::Header::new_ustar();
    h.set_path("big").expect("path");
    h.set_size(1 << 40);
    h.set_cksum();
    head.extend_from_slice(h.as_bytes());
    let input = Endless {
        header: head.clone(),
        pos: 0,
    };
    let o = DrainOptions {
        max_input_bytes: 1 << 20,
        ..opts(10)
    };
    let mut out = Vec::new();
    let outcome = drain_stream(input, &mut out, &o)
        .await
        .expect("the bound is not a failure of what was read");
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    assert_eq!(outcome.stopped_at_input_bound, Some(1 << 20));
    let kept: Vec<_> = members_of(&out).into_iter().map(|m| (m.0, m.2)).collect();
    assert_eq!(kept, vec![("a.txt".to_string(), b"kept\n".to_vec())]);
    assert_eq!(
        outcome.dropped,
        vec![DroppedRecord {
            path: "big".into(),
            size: 1 << 40,
            reason: DROPPED_OVER_CAP.into(),
            in_pod: false,
        }]
    );
    assert_eq!(
        outcome.input_bytes,
        head.len() as u64,
        "it stopped at the header: none of the 1 TiB was read"
    );
}

#[tokio::test]
async fn reaching_the_input_bound_between_members_ends_capped_with_the_earlier_members_kept() {
    // An entry flood of small files: the bound is reached while a header is being read.
    let mut t = Vec::new();
    for i in 0..200 {
        raw_entry(&mut t, b'0', &format!("f{i:03}"), None, b"x");
    }
    end(&mut t);
    let o = DrainOptions {
        max_input_bytes: 100 * 1024 + 100,
        ..opts(1 << 20)
    };
    let (outcome, out) = drain(&t, &o).await.expect("capped, not failed");
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    assert_eq!(outcome.stopped_at_input_bound, Some(o.max_input_bytes));
    // 1024 bytes per member: the 100th is whole at 102400, the 101st header crosses.
    let stored = members_of(&out);
    assert_eq!(stored.len(), 100, "every member read whole is kept");
    assert_eq!(outcome.members.len(), 100);
    assert!(stored.iter().all(|m| m.2 == b"x"), "no member cut short");
    assert!(outcome.dropped.is_empty());
}

#[tokio::test]
async fn a_member_within_the_cap_that_would_cross_the_input_bound_is_listed_and_not_cut() {
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "before", None, b"b");
    raw_entry(&mut t, b'0', "whole", None, &[5u8; 4096]);
    raw_entry(&mut t, b'0', "after", None, b"a");
    end(&mut t);
    let o = DrainOptions {
        max_input_bytes: 2048,
        ..opts(1 << 20)
    };
    let (outcome, out) = drain(&t, &o).await.expect("capped");
    let names: Vec<_> = members_of(&out).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["before"]);
    assert_eq!(
        outcome.dropped,
        vec![DroppedRecord {
            path: "whole".into(),
            size: 4096,
            reason: DROPPED_INPUT_BOUND.into(),
            in_pod: false,
        }]
    );
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
}

#[tokio::test]
async fn zeros_forever_after_the_end_marker_fail_at_the_input_bound() {
    // The archive ended; a packer that keeps writing is broken or hostile: Failed, as before.
    let input = Endless {
        header: Vec::new(),
        pos: 0,
    };
    let o = DrainOptions {
        max_input_bytes: 1 << 20,
        ..opts(10)
    };
    let mut out = Vec::new();
    let err = drain_stream(input, &mut out, &o)
        .await
        .expect_err("must fail");
    assert!(
        matches!(err.kind, DrainErrorKind::InputLimit { limit } if limit == 1 << 20),
        "{err}"
    );
    assert!(err.progress.input_bytes <= (1 << 20) + 65536);
}

#[tokio::test]
async fn the_placeholder_of_a_member_dropped_in_the_pod_becomes_a_dropped_member() {
    // The real packer, with a budget, over a sparse 8 GiB file and a small result.
    let dir = tempfile::tempdir().expect("tempdir");
    let big = std::fs::File::create(dir.path().join("big.bin")).expect("create");
    big.set_len(8 << 30).expect("set_len");
    drop(big);
    std::fs::write(dir.path().join("result.txt"), b"0123456789").expect("write");
    let mut stream = Vec::new();
    crate::inpod::pack::pack(dir.path(), Some(1 << 20), &mut stream, io::sink()).expect("pack");
    let (outcome, out) = drain(&stream, &opts(1 << 20)).await.expect("drain");
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    assert_eq!(
        outcome.dropped,
        vec![DroppedRecord {
            path: "big.bin".into(),
            size: 8 << 30,
            reason: DROPPED_OVER_CAP.into(),
            in_pod: true,
        }]
    );
    let stored: Vec<_> = members_of(&out).into_iter().map(|m| (m.0, m.2)).collect();
    assert_eq!(
        stored,
        vec![("result.txt".to_string(), b"0123456789".to_vec())],
        "the placeholder is never stored as an empty file"
    );
    assert_eq!(outcome.bytes, 10);
    assert_eq!(outcome.stopped_at_input_bound, None);
    assert!(outcome.input_bytes < 16 * 1024, "{}", outcome.input_bytes);
}

#[tokio::test]
async fn a_forged_or_malformed_drop_record_is_rejected_and_never_stored() {
    let record = |v: &str| ustar::record(ustar::DROPPED_KEY, v.as_bytes());
    let mut t = Vec::new();
    // Valid: listed as dropped, with the size the pod claims.
    pax_entry(&mut t, &record("9223372036854775807"));
    raw_entry(&mut t, b'0', "claims-max", None, b"");
    pax_entry(&mut t, &record("9223372036854775807"));
    raw_entry(&mut t, b'0', "claims-max-again", None, b"");
    pax_entry(&mut t, &record("9223372036854775807"));
    raw_entry(&mut t, b'0', "claims-max-thrice", None, b"");
    // Invalid: rejected, never stored as an (empty or not) file.
    pax_entry(&mut t, &record("12abc"));
    raw_entry(&mut t, b'0', "not-a-number", None, b"");
    pax_entry(&mut t, &record("99999999999999999999"));
    raw_entry(&mut t, b'0', "too-large", None, b"");
    pax_entry(&mut t, &record("4"));
    raw_entry(&mut t, b'0', "has-content", None, b"data");
    pax_entry(&mut t, &record("4"));
    raw_entry(&mut t, b'5', "a-dir/", None, b"");
    // An unsafe path stays rejected for its path, record or not.
    pax_entry(&mut t, &record("4"));
    raw_entry(&mut t, b'0', "../escape", None, b"");
    raw_entry(&mut t, b'0', "ok.txt", None, b"fine");
    end(&mut t);
    let (outcome, out) = drain(&t, &opts(1024)).await.expect("drain");
    let names: Vec<_> = members_of(&out).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["ok.txt"]);
    let dropped: Vec<_> = outcome
        .dropped
        .iter()
        .map(|d| (d.path.as_str(), d.size, d.in_pod))
        .collect();
    assert_eq!(
        dropped,
        [
            ("claims-max", i64::MAX as u64, true),
            ("claims-max-again", i64::MAX as u64, true),
            ("claims-max-thrice", i64::MAX as u64, true),
        ]
    );
    let rejected: Vec<_> = outcome
        .rejected
        .iter()
        .map(|r| (r.path.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        rejected,
        [
            ("not-a-number", "invalid_drop_record"),
            ("too-large", "invalid_drop_record"),
            ("has-content", "invalid_drop_record"),
            ("a-dir/", "invalid_drop_record"),
            ("../escape", "parent_dir"),
        ]
    );
    // Forged sizes cannot overflow the totals (three times i64::MAX is past u64::MAX).
    let (run, ctx) = ctx();
    let keys = object_keys(
        &object_store::path::Path::from("p"),
        &run,
        0,
        "/out",
        Compression::None,
    );
    let now = jiff::Timestamp::now();
    let m = Manifest::new(&ctx, &keys, opts(1024).stored(), &outcome, now, now);
    assert_eq!(m.totals.dropped_bytes, u64::MAX);
    assert_eq!(m.phase, ReadBackPhase::Capped);
}

#[tokio::test]
async fn a_huge_pax_header_is_refused_before_it_is_buffered() {
    let mut t = Vec::new();
    let records = ustar::record(b"comment", &vec![b'c'; 3 * 1024 * 1024]);
    pax_entry(&mut t, &records);
    raw_entry(&mut t, b'0', "f", None, b"x");
    end(&mut t);
    let err = drain(&t, &opts(1024)).await.expect_err("must fail");
    assert!(
        matches!(err.kind, DrainErrorKind::ExtensionTooLarge { limit, .. } if limit == MAX_EXTENSION_BODY_BYTES),
        "{err}"
    );
    assert_eq!(
        err.progress.input_bytes, 512,
        "not a byte of the body was read"
    );
    assert_eq!(err.metric_label(), "malformed");
}

/// A header announcing `size` bytes of type `ty`, then zeros forever.
fn endless_after(ty: u8, size: u64) -> Endless {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::new(ty));
    h.set_path("././@LongLink").expect("path");
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    Endless {
        header: h.as_bytes().to_vec(),
        pos: 0,
    }
}

#[tokio::test]
async fn a_two_gib_gnu_long_name_is_refused_as_malformed_before_its_body_is_read() {
    for (ty, what) in [
        (b'L', "GNU long name"),
        (b'K', "GNU long link"),
        (b'x', "PAX extended header"),
    ] {
        let o = DrainOptions::new(1 << 40, Compression::None);
        let mut out = Vec::new();
        let err = drain_stream(endless_after(ty, 2 << 30), &mut out, &o)
            .await
            .expect_err("must fail");
        assert!(
            matches!(err.kind, DrainErrorKind::ExtensionTooLarge { size, .. } if size == 2 << 30),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("malformed") && text.contains(what), "{text}");
        assert_eq!(
            err.progress.input_bytes, 512,
            "{what}: only its header was read"
        );
    }
    // One at the bound is read (and, with nothing after it, is a truncated stream).
    let o = opts(1024);
    let mut t = Vec::new();
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::new(b'L'));
    h.set_path("././@LongLink").expect("path");
    h.set_size(MAX_EXTENSION_BODY_BYTES);
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    t.extend_from_slice(&vec![b'n'; MAX_EXTENSION_BODY_BYTES as usize]);
    let err = drain(&t, &o).await.expect_err("no member follows");
    assert!(
        !matches!(err.kind, DrainErrorKind::ExtensionTooLarge { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn an_extension_after_a_kept_member_is_watched_too() {
    // The watch follows the stream: after a member whose content was read (and padded), the
    // next header is where the parser reads it.
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "first.txt", None, b"12345");
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::new(b'L'));
    h.set_path("././@LongLink").expect("path");
    h.set_size(1 << 30);
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    t.extend_from_slice(&[b'n'; 4096]);
    let err = drain(&t, &opts(1024)).await.expect_err("must fail");
    assert!(
        matches!(err.kind, DrainErrorKind::ExtensionTooLarge { .. }),
        "{err}"
    );
    assert_eq!(err.progress.members, 1);
    assert_eq!(err.progress.input_bytes, 1536);
}

#[tokio::test]
async fn the_drain_counts_the_size_the_parser_skips_not_the_larger_header_size() {
    // The ustar size says 100 MiB, a PAX `size` record says 0: the parser skips nothing, so
    // neither may the drain's bounds (it used to take the larger one, stopping at the input
    // bound here, and widening the header window by 100 MiB).
    let mut t = Vec::new();
    pax_entry(&mut t, &ustar::record(b"size", b"0"));
    let mut h = tar::Header::new_ustar();
    h.set_path("claims-100-mib").expect("path");
    h.set_size(100 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    raw_entry(&mut t, b'0', "after.txt", None, b"hi");
    end(&mut t);
    let o = DrainOptions {
        max_input_bytes: 1 << 20,
        ..opts(1 << 20)
    };
    let (outcome, out) = drain(&t, &o).await.expect("drain");
    assert_eq!(outcome.stopped_at_input_bound, None);
    assert_eq!(outcome.phase(), ReadBackPhase::Drained);
    let stored: Vec<_> = members_of(&out).into_iter().map(|m| (m.0, m.2)).collect();
    assert_eq!(
        stored,
        vec![
            ("claims-100-mib".to_string(), Vec::new()),
            ("after.txt".to_string(), b"hi".to_vec())
        ]
    );
}

/// A path of `len` bytes made of 250-byte components, unique by `i`.
fn long_name(i: usize, len: usize) -> String {
    let tail = format!("f{i:06}");
    let mut name = String::new();
    while name.len() + 251 + tail.len() <= len {
        name.push_str(&"d".repeat(250));
        name.push('/');
    }
    name.push_str(&"n".repeat(len - name.len() - tail.len()));
    name.push_str(&tail);
    name
}

#[tokio::test]
async fn empty_files_with_long_names_are_metered_against_the_metadata_allowance() {
    // Item 5 of issue 10, scaled down: 5,000 empty files with 4 KiB names under a 1 MiB cap
    // would store 20 MiB of names (50,000 of them: 200 MiB) if only content were metered.
    let n = 5_000;
    let mut t = Vec::new();
    for i in 0..n {
        raw_entry(&mut t, b'0', &long_name(i, 4096), None, b"");
    }
    raw_entry(&mut t, b'0', "small.txt", None, b"kept");
    end(&mut t);
    let o = opts(1 << 20);
    assert_eq!(o.metadata_allowance, 1 << 20);
    let (outcome, out) = drain(&t, &o).await.expect("drain");
    let per_member = cap::metadata_cost(&long_name(0, 4096), None);
    let kept = ((1 << 20) / per_member) as usize;
    assert_eq!(outcome.members.len(), kept + 1, "the small one still fits");
    assert_eq!(
        outcome.members.last().map(|m| m.path.as_str()),
        Some("small.txt")
    );
    assert_eq!(outcome.dropped_count(), (n - kept) as u64);
    assert!(outcome
        .dropped
        .iter()
        .all(|d| d.reason == DROPPED_METADATA && d.size == 0 && !d.in_pod));
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    assert_eq!(members_of(&out).len(), kept + 1);
    assert!(
        out.len() as u64 <= 2 * (1 << 20) + 4096,
        "the stored archive is bounded by the allowance: {} bytes",
        out.len()
    );
}

#[tokio::test]
async fn directories_and_links_are_metered_too_and_a_later_small_member_still_fits() {
    let mut t = Vec::new();
    raw_entry(&mut t, b'5', "d/", None, b"");
    raw_entry(&mut t, b'2', "l", Some(&"x".repeat(300)), b"");
    raw_entry(&mut t, b'0', "f", None, b"abc");
    end(&mut t);
    let o = DrainOptions {
        metadata_allowance: 512 + 1 + 512 + 1,
        ..opts(1024)
    };
    let (outcome, out) = drain(&t, &o).await.expect("drain");
    let names: Vec<_> = members_of(&out).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["d/", "f"]);
    assert_eq!(
        outcome.dropped,
        vec![DroppedRecord {
            path: "l".into(),
            size: 0,
            reason: DROPPED_METADATA.into(),
            in_pod: false,
        }]
    );
    assert_eq!(outcome.bytes, 3);
}

#[tokio::test]
async fn a_symlink_dropped_over_the_metadata_allowance_is_not_remembered() {
    // docs/contract.md "Drain memory": the sanitizer forgets a link the meter dropped (it
    // used to keep every accepted link's full path: 4.9 GiB for 150,000 long ones), so an
    // entry below it is a plain path; below a stored link it is still rejected.
    let mut t = Vec::new();
    raw_entry(&mut t, b'2', "l", Some(&"x".repeat(3000)), b"");
    raw_entry(&mut t, b'2', "k", Some("t"), b"");
    raw_entry(&mut t, b'0', "l/f", None, b"ab");
    raw_entry(&mut t, b'0', "k/f", None, b"cd");
    end(&mut t);
    let o = DrainOptions {
        metadata_allowance: 2000,
        ..opts(1024)
    };
    let (outcome, out) = drain(&t, &o).await.expect("drain");
    let names: Vec<_> = members_of(&out).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["k", "l/f"]);
    assert_eq!(outcome.dropped.len(), 1);
    assert_eq!(outcome.dropped[0].path, "l");
    assert_eq!(outcome.rejected.len(), 1);
    assert_eq!(outcome.rejected[0].path, "k/f");
    assert_eq!(outcome.rejected[0].reason, Reason::ThroughSymlink);
}

#[tokio::test]
async fn dropped_and_rejected_records_past_their_bound_are_counted_not_listed() {
    let mut t = Vec::new();
    for i in 0..20 {
        raw_entry(&mut t, b'0', &format!("big{i:02}"), None, &[1u8; 100]);
        raw_entry(&mut t, b'6', &format!("fifo{i:02}"), None, b"");
    }
    // A rejected path of 60 KiB is listed cut short.
    let huge = format!("/{}", "a/".repeat(30 * 1024));
    raw_entry(&mut t, b'0', &huge, None, b"");
    end(&mut t);
    let o = DrainOptions {
        max_listed_record_bytes: 5 * (RECORD_OVERHEAD_BYTES + 5) + 5 * (RECORD_OVERHEAD_BYTES + 6),
        ..opts(10)
    };
    let (outcome, _) = drain(&t, &o).await.expect("drain");
    assert_eq!(outcome.dropped.len() + outcome.rejected.len(), 10);
    assert_eq!(outcome.dropped_count(), 20);
    assert_eq!(outcome.rejected_count(), 21);
    assert_eq!(outcome.dropped_bytes(), 2000);
    assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    let (run, ctx) = ctx();
    let keys = object_keys(
        &object_store::path::Path::from("p"),
        &run,
        0,
        "/out",
        Compression::None,
    );
    let now = jiff::Timestamp::now();
    let m = Manifest::new(&ctx, &keys, o.stored(), &outcome, now, now);
    assert_eq!(m.totals.dropped_members, 20);
    assert_eq!(m.totals.dropped_bytes, 2000);
    assert_eq!(m.totals.rejected_members, 21);
    assert_eq!(m.outcome(), outcome, "the manifest round-trips the counts");
    // The huge rejected path, listed with room to spare, is cut.
    let o = opts(10);
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', &huge, None, b"");
    end(&mut t);
    let (outcome, _) = drain(&t, &o).await.expect("drain");
    let path = &outcome.rejected[0].path;
    assert!(path.len() < MAX_REJECTED_PATH_BYTES + 32, "{}", path.len());
    assert!(
        path.ends_with(&format!("... ({} bytes)", huge.len())),
        "{path}"
    );
}

#[tokio::test]
async fn too_many_entries_fail_the_drain() {
    let mut t = Vec::new();
    for i in 0..5 {
        raw_entry(&mut t, b'0', &format!("f{i}"), None, b"x");
    }
    end(&mut t);
    let mut o = opts(1024);
    o.limits.max_entries = 3;
    let err = drain(&t, &o).await.expect_err("must fail");
    assert!(
        matches!(err.kind, DrainErrorKind::TooManyEntries { limit: 3 }),
        "{err}"
    );
}

#[tokio::test]
async fn pax_size_override_does_not_smuggle_entries() {
    // TARmageddon (CVE-2025-62518): the ustar size says 0 but a PAX record says N. A parser
    // that ignores the PAX size reads the member's content as headers and finds
    // "smuggled.txt". The fixed parser reads N bytes of content; we re-emit one member
    // whose ustar size is N, so no reader of the STORED archive can be confused either.
    let mut inner = Vec::new();
    raw_entry(&mut inner, b'0', "smuggled.txt", None, b"evil");
    let n = inner.len();
    let mut t = Vec::new();
    pax_entry(&mut t, &ustar::record(b"size", n.to_string().as_bytes()));
    let mut h = tar::Header::new_ustar();
    h.set_path("outer.bin").expect("path");
    h.set_size(0);
    h.set_mode(0o644);
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    t.extend_from_slice(&inner);
    end(&mut t);

    let (outcome, out) = drain(&t, &opts(1 << 20)).await.expect("drain");
    let paths: Vec<_> = outcome.members.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["outer.bin"]);
    assert_eq!(outcome.members[0].size, n as u64);
    let stored = members_of(&out);
    assert_eq!(stored.len(), 1, "one member, nothing smuggled");
    assert_eq!(stored[0].0, "outer.bin");
    assert_eq!(
        stored[0].2, inner,
        "the inner archive is content, not entries"
    );
    assert_eq!(
        u64::from_str_radix(std::str::from_utf8(&out[124..135]).unwrap_or(""), 8).ok(),
        Some(n as u64)
    );
}

#[tokio::test]
async fn long_paths_survive_the_round_trip_via_pax() {
    let long = format!("{}/{}", "d".repeat(200), "f".repeat(200));
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', &long, None, b"deep");
    end(&mut t);
    let (outcome, out) = drain(&t, &opts(1024)).await.expect("drain");
    assert_eq!(outcome.members[0].path, long);
    let stored = members_of(&out);
    assert_eq!(
        (stored[0].0.as_str(), stored[0].2.as_slice()),
        (long.as_str(), &b"deep"[..])
    );
}

fn ctx() -> (RunId, ManifestContext) {
    let run = RunId {
        namespace: "ns".into(),
        name: "job".into(),
        uid: "u1".into(),
    };
    let ctx = ManifestContext {
        run: run.clone(),
        declared_path: "/out".into(),
        index: 0,
        attempt: 1,
    };
    (run, ctx)
}

#[tokio::test]
async fn drain_into_store_uploads_the_archive_then_commits_the_manifest() {
    let (store, prefix) = store_from_url("memory://", &[]).expect("store");
    let (run, ctx) = ctx();
    let keys = object_keys(&prefix, &run, 0, "/out", Compression::Gzip);
    let o = DrainOptions::new(1024, Compression::Gzip);
    let (outcome, manifest) = drain_into_store(&sample()[..], &store, &keys, &o, ctx.clone())
        .await
        .expect("drain");
    assert_eq!(manifest.members, outcome.members);
    assert_eq!(manifest.archive_key, keys.archive.to_string());
    let stored = store
        .get(&keys.archive)
        .await
        .expect("archive")
        .bytes()
        .await
        .expect("bytes");
    let names: Vec<_> = members_of(&decompress(&stored, Compression::Gzip).await)
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(names, ["a/", "a/b.txt", "l", "z.txt"]);
    assert_eq!(
        crate::store::read_manifest(&store, &keys.manifest)
            .await
            .expect("manifest"),
        manifest
    );

    // A retry after the commit does not drain (even a broken stream) and returns the commit.
    let retry = ManifestContext { attempt: 2, ..ctx };
    let (_, again) = drain_into_store(&b"garbage"[..], &store, &keys, &o, retry)
        .await
        .expect("committed");
    assert_eq!(again.attempt, 1);
}

#[tokio::test]
async fn duplicate_members_resolve_last_wins_and_extract() {
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "a.txt", None, b"one");
    raw_entry(&mut t, b'5', "d/", None, b"");
    raw_entry(&mut t, b'0', "d/x", None, b"x");
    raw_entry(&mut t, b'0', "./a.txt", None, b"two");
    // A directory replaced by a file (or the reverse) has no safe reading: rejected.
    raw_entry(&mut t, b'0', "d", None, b"not a dir");
    raw_entry(&mut t, b'5', "a.txt/", None, b"");
    raw_entry(&mut t, b'5', "d/", None, b"");
    end(&mut t);
    let (store, prefix) = store_from_url("memory://", &[]).expect("store");
    let (run, ctx) = ctx();
    let keys = object_keys(&prefix, &run, 0, "/out", Compression::None);
    let (outcome, manifest) = drain_into_store(&t[..], &store, &keys, &opts(1024), ctx)
        .await
        .expect("drain");
    let members: Vec<_> = outcome
        .members
        .iter()
        .map(|m| (m.path.as_str(), m.superseded))
        .collect();
    assert_eq!(
        members,
        [
            ("a.txt", true),
            ("d", true),
            ("d/x", false),
            ("a.txt", false),
            ("d", false)
        ]
    );
    assert_eq!(
        outcome.members[0].sha256.as_deref(),
        Some(sha(b"one").as_str())
    );
    let rejected: Vec<_> = outcome
        .rejected
        .iter()
        .map(|r| (r.path.as_str(), r.reason))
        .collect();
    assert_eq!(
        rejected,
        [
            ("d", Reason::DuplicatePath),
            ("a.txt/", Reason::DuplicatePath)
        ]
    );
    assert_eq!(
        outcome.bytes, 7,
        "a superseded member is stored, so metered"
    );
    // One duplicate does not block the extraction of the path: the last one wins.
    let dir = tempfile::tempdir().expect("tempdir");
    let n = crate::files::extract_verified(&store, &manifest, &dir.path().join("x"))
        .await
        .expect("extract");
    assert_eq!(n, 5);
    assert_eq!(
        std::fs::read(dir.path().join("x/a.txt")).expect("a.txt"),
        b"two"
    );
    assert_eq!(std::fs::read(dir.path().join("x/d/x")).expect("d/x"), b"x");
}

#[tokio::test]
async fn drain_failure_is_never_an_empty_set_and_leaves_no_upload_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = url::Url::from_directory_path(dir.path())
        .expect("url")
        .to_string();
    let (store, prefix) = store_from_url(&url, &[]).expect("store");
    let (run, ctx) = ctx();
    let keys = object_keys(&prefix, &run, 0, "/out", Compression::None);
    // Big enough for the writer to start a multipart upload before the stream breaks.
    let mut t = Vec::new();
    raw_entry(&mut t, b'0', "big", None, &vec![7u8; 7 * 1024 * 1024]);
    end(&mut t);
    let cut = &t[..6 * 1024 * 1024 + 512];
    let o = DrainOptions::new(16 * 1024 * 1024, Compression::None);
    let err = drain_into_store(cut, &store, &keys, &o, ctx)
        .await
        .expect_err("must fail");
    assert!(matches!(err.kind, DrainErrorKind::Truncated(_)), "{err}");
    let left: Vec<_> = walkdir::WalkDir::new(dir.path())
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(
        left.is_empty(),
        "no archive, no manifest, no multipart staging: {left:?}"
    );
}
