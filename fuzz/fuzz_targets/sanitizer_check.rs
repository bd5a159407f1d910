//! Arbitrary sequences of tar entries through `Sanitizer::check`: never a panic, and whatever it
//! accepts is a normalized relative path that stays inside the archive root, never at or below an
//! accepted symlink, with a symlink target that cannot climb above the root.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sandboxrun_operator::tar::sanitize::{
    Decision, EntryInfo, EntryKind, Limits, MemberKind, Sanitizer,
};

#[derive(Arbitrary, Debug)]
struct Entry {
    path: Vec<u8>,
    type_byte: u8,
    link: Option<Vec<u8>>,
    size: u64,
}

fuzz_target!(|entries: Vec<Entry>| {
    let mut s = Sanitizer::new(Limits {
        max_entries: 64,
        ..Limits::default()
    });
    let mut links: BTreeSet<String> = BTreeSet::new();
    for e in &entries {
        let info = EntryInfo {
            path: &e.path,
            kind: EntryKind::from_type_byte(e.type_byte),
            link_target: e.link.as_deref(),
            size: e.size,
        };
        let Decision::Accept(a) = s.check(&info) else {
            continue;
        };
        assert!(!a.path.is_empty() && !a.path.starts_with('/'), "{a:?}");
        let comps: Vec<&str> = a.path.split('/').collect();
        assert!(
            comps
                .iter()
                .all(|c| !c.is_empty() && *c != "." && *c != ".."),
            "{a:?}"
        );
        assert!(!a.path.contains('\0') && !a.path.contains('\\'), "{a:?}");
        // Never at or below an accepted symlink.
        for i in 1..=comps.len() {
            let prefix = comps[..i].join("/");
            assert!(
                !links.contains(&prefix),
                "{a:?} passes through link {prefix}"
            );
        }
        if a.kind == MemberKind::Symlink {
            let target = a.link_target.as_deref().expect("target");
            assert!(!target.is_empty() && !target.starts_with('/'), "{a:?}");
            // Lexically, from the link's directory, the target never climbs above the root.
            let mut depth = comps.len() as i64 - 1;
            for c in target.split('/') {
                match c {
                    ".." => depth -= 1,
                    "" | "." => {}
                    _ => depth += 1,
                }
                assert!(depth >= 0, "{a:?} escapes the root");
            }
            links.insert(a.path.clone());
        }
    }
});
