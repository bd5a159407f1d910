//! The tables of the documentation that list what the code writes, checked against the code so
//! that the next reason added to one and not the other fails a test (issue #56): the `Ready`
//! reasons table of docs/user-guide.md "Troubleshooting" against [`super::run::status::ready_reasons`].

use std::collections::BTreeSet;
use std::path::Path;

fn shipped(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names in backquotes of the first column of the Markdown table whose header row starts
/// with `header` (`| \`Ready\` reason |`): a row may name several (`A`, `B`, `C`).
fn first_column_names(doc: &str, header: &str) -> BTreeSet<String> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table headed `{header}`");
    let name = regex::Regex::new(r"`([^`]+)`").unwrap_or_else(|e| panic!("{e}"));
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1))
        .flat_map(|cell| {
            name.captures_iter(cell)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_ready_reasons_table_lists_exactly_the_reasons_the_code_writes() {
    let code: BTreeSet<String> = super::run::status::ready_reasons()
        .into_iter()
        .map(String::from)
        .collect();
    let docs = first_column_names(&shipped("docs/user-guide.md"), "| `Ready` reason |");
    let missing: Vec<_> = code.difference(&docs).collect();
    let stale: Vec<_> = docs.difference(&code).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/user-guide.md's Ready reasons table differs from the code: \
         not in the table {missing:?}; in the table, never written {stale:?}"
    );
}

#[test]
fn a_table_is_read_from_its_header_to_its_last_row() {
    let doc = "text\n| `R` reason | Status |\n|---|---|\n| `A` | False |\n\
               | `B`, `C` | True | `D` |\nafter\n| `E` | x |\n";
    let names: Vec<String> = first_column_names(doc, "| `R` reason |")
        .into_iter()
        .collect();
    assert_eq!(names, ["A", "B", "C"]);
}
