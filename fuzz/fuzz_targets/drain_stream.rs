//! Arbitrary bytes as the holder's tar stream: the drain must return Ok or Err, never panic, hang
//! or store anything unsafe. The first byte picks the compression, the rest is the stream.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sandboxrun_operator::api::{Compression, ReadBackPhase};
use sandboxrun_operator::drain::{drain_stream, DrainOptions};
use sandboxrun_operator::tar::sanitize::MemberKind;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

const CAP: u64 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let (compression, stream) = match data.split_first() {
        Some((b, rest)) => (
            match b % 3 {
                0 => Compression::None,
                1 => Compression::Gzip,
                _ => Compression::Zstd,
            },
            rest,
        ),
        None => (Compression::None, data),
    };
    let mut opts = DrainOptions::new(CAP, compression);
    opts.max_input_bytes = 1 << 20;
    opts.max_header_bytes = 64 * 1024;
    opts.limits.max_entries = 512;
    let result = runtime().block_on(drain_stream(stream, tokio::io::sink(), &opts));
    let Ok(outcome) = result else { return };
    // Invariants of an accepted stream.
    assert!(outcome.bytes <= CAP, "the cap holds: {}", outcome.bytes);
    assert!(outcome.input_bytes <= stream.len() as u64);
    let stored: u64 = outcome.members.iter().map(|m| m.size).sum();
    assert_eq!(stored, outcome.bytes);
    for m in &outcome.members {
        assert!(!m.path.is_empty() && !m.path.starts_with('/'), "{m:?}");
        assert!(
            m.path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."),
            "{m:?}"
        );
        match m.kind {
            MemberKind::File => assert!(m.sha256.as_ref().is_some_and(|h| h.len() == 64)),
            MemberKind::Symlink => {
                let t = m.link_target.as_deref().expect("a symlink has a target");
                assert!(!t.starts_with('/'), "{m:?}");
            }
            MemberKind::Dir => assert_eq!(m.size, 0),
        }
    }
    // Capped exactly when something was dropped or the input bound cut the stream.
    if outcome.dropped.is_empty() && outcome.stopped_at_input_bound.is_none() {
        assert_ne!(outcome.phase(), ReadBackPhase::Capped);
    } else {
        assert_eq!(outcome.phase(), ReadBackPhase::Capped);
    }
    if let Some(bound) = outcome.stopped_at_input_bound {
        assert_eq!(bound, opts.max_input_bytes);
    }
});
