//! The module map of docs/architecture.md names exactly the files under `src/` (issue #26): a
//! file added, moved or removed without the map fails this test, which says which files the map
//! misses and which it names in vain.

use std::collections::BTreeSet;
use std::path::Path;

/// The `.rs` files the "Module map" table's files column names, as paths from `src/`, with
/// `dir/{a,b}.rs` expanded.
fn mapped_files(architecture: &str) -> BTreeSet<String> {
    let start = architecture
        .find("## Module map")
        .expect("docs/architecture.md has a \"## Module map\" section");
    let section = &architecture[start + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut files = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let Some(column) = row.split('|').nth(2) else {
            continue;
        };
        for (i, token) in column.split('`').enumerate() {
            if i % 2 == 1 && token.ends_with(".rs") {
                files.extend(expand(token));
            }
        }
    }
    files
}

/// `dir/{a,b}.rs` → `dir/a.rs`, `dir/b.rs`; a name without braces is itself.
fn expand(token: &str) -> Vec<String> {
    match (token.find('{'), token.find('}')) {
        (Some(open), Some(close)) if open < close => token[open + 1..close]
            .split(',')
            .map(|name| format!("{}{}{}", &token[..open], name.trim(), &token[close + 1..]))
            .collect(),
        _ => vec![token.to_string()],
    }
}

/// Every `.rs` file under `dir`, as a path from `root`.
fn source_files(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            source_files(root, &path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let relative = path.strip_prefix(root).expect("under src/");
            out.insert(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn the_module_map_names_exactly_the_files_under_src() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let architecture = std::fs::read_to_string(crate_dir.join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let mapped = mapped_files(&architecture);
    let src = crate_dir.join("src");
    let mut present = BTreeSet::new();
    source_files(&src, &src, &mut present);
    let missing: Vec<&String> = present.difference(&mapped).collect();
    let extra: Vec<&String> = mapped.difference(&present).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/architecture.md's module map is out of date with src/ (fix the \"files\" column):\n  \
         missing from the map (files under src/): {missing:?}\n  \
         extra in the map (no such file under src/): {extra:?}"
    );
}

#[test]
fn braces_expand_to_one_file_each() {
    assert_eq!(
        expand("tar/{ustar,notes}.rs"),
        ["tar/ustar.rs", "tar/notes.rs"]
    );
    assert_eq!(expand("lib.rs"), ["lib.rs"]);
    let map = "## Module map\n\n| a | files | b |\n|---|---|---|\n| x | `a/{b,c}.rs`, `d.rs` (pure) | `not/this.rs` |\n\n## Next\n| y | `e.rs` | |\n";
    let files: Vec<String> = mapped_files(map).into_iter().collect();
    assert_eq!(files, ["a/b.rs", "a/c.rs", "d.rs"]);
}
