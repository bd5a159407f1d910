//! What the documentation claims about the code, kept true by tests (issue #56): tables the docs
//! show are generated from the code between `<!-- NAME: generated … -->` and `<!-- /NAME -->`
//! markers, and a test fails when the committed block differs from what the code renders (as
//! `hack/gen.sh --check` does for the CRDs). `hack/gen.sh` writes them: these tests, run with
//! `SANDBOXRUN_WRITE_DOC_TABLES=<dir>`, write each regenerated document there.
//!
//! - [`run_flags`]: every flag of `sandboxrun-operator run` in docs/operations.md, and every flag
//!   the chart's values table names exists;
//! - [`chart_values`]: every value docs/operations.md names is a key of the chart's values.yaml;
//! - [`crd_applies`]: every document and script applies all four CRDs, never one file by name;
//! - [`links`]: every link between the README, the adopter files and docs/ resolves;
//! - [`printer_columns`]: the `kubectl get` columns of each kind in docs/user-guide.md, and every
//!   `kubectl get` output the README and docs show has the columns the CRDs print.

mod chart_values;
mod crd_applies;
mod links;
mod printer_columns;
mod run_flags;

use std::path::Path;

const WRITE_TO: &str = "SANDBOXRUN_WRITE_DOC_TABLES";

/// A shipped file of the repository, read whole.
fn shipped(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `doc` with the block between `<!-- {name}: …-->` and `<!-- /{name} -->` replaced by `body`
/// (the marker lines kept); `None` when `doc` lacks either marker.
fn with_block(doc: &str, name: &str, body: &str) -> Option<String> {
    let open = doc.find(&format!("<!-- {name}:"))?;
    let body_start = open + doc[open..].find("-->\n")? + "-->\n".len();
    let close = body_start + doc[body_start..].find(&format!("<!-- /{name} -->"))?;
    Some(format!("{}{body}{}", &doc[..body_start], &doc[close..]))
}

/// Checks that `file`'s block `name` is `body`; with `SANDBOXRUN_WRITE_DOC_TABLES=<dir>` writes
/// the regenerated document to `<dir>/<file>` instead (hack/gen.sh copies or diffs it).
fn check_or_write(file: &str, name: &str, body: &str) {
    let doc = shipped(file);
    let fresh = with_block(&doc, name, body).unwrap_or_else(|| {
        panic!("{file} lacks the markers <!-- {name}: … --> … <!-- /{name} -->")
    });
    if let Some(dir) = std::env::var_os(WRITE_TO) {
        let out = Path::new(&dir).join(file);
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        }
        std::fs::write(&out, fresh).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
        return;
    }
    assert!(
        fresh == doc,
        "{file}'s generated block `{name}` differs from the code: run `hack/gen.sh` and commit it\n\
         --- expected block ---\n{body}"
    );
}

/// A Markdown table cell's text: pipes escaped, lines joined.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[test]
fn a_generated_block_is_replaced_between_its_markers_and_nowhere_else() {
    let doc = "a\n<!-- t: generated -->\nold\n<!-- /t -->\nb <!-- /t -->\n";
    assert_eq!(
        with_block(doc, "t", "new\n").as_deref(),
        Some("a\n<!-- t: generated -->\nnew\n<!-- /t -->\nb <!-- /t -->\n")
    );
    assert_eq!(with_block("no markers", "t", "x"), None);
    assert_eq!(with_block("<!-- t: x -->\nno end", "t", "x"), None);
}

#[test]
fn a_cell_escapes_pipes_and_joins_lines() {
    assert_eq!(cell("a | b\n  c"), "a \\| b c");
}
