//! The links between the documents: every relative link of the README, the adopter files and
//! docs/ names a file of the repository, and a link to a heading (`file.md#anchor`, `#anchor`)
//! names one the file has, so moving text between them (issue #56: the README's long parts went
//! to docs/) cannot leave a link dangling.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::shipped;

/// The documents whose links are checked, relative to the repository.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = [
        "README.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "CHANGELOG.md",
        "charts/sandboxrun-operator/README.md",
    ]
    .map(String::from)
    .into();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            docs.push(format!("docs/{name}"));
        }
    }
    docs.sort();
    docs
}

/// GitHub's anchor of a heading: lower case, backquotes and punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown document's headings (outside fenced code blocks).
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in doc.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The relative link targets of a document (`[text](target)`), web and mail links left out.
fn relative_links(doc: &str) -> Vec<String> {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap_or_else(|e| panic!("{e}"));
    link.captures_iter(doc)
        .map(|c| c[1].to_string())
        .filter(|t| !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

/// `base`'s directory joined with `target`, `..` resolved; `None` when it leaves the repository.
fn resolve(base: &str, target: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let joined = Path::new(base).parent()?.join(target);
    for part in joined.components() {
        match part {
            Component::ParentDir if !out.pop() => return None,
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    Some(out)
}

/// Whether `target`, a link of `file` (whose text is `doc`), is broken: it names no file, or a
/// heading its Markdown file lacks. `read` gives a file's text (empty for a directory or a file
/// that is not Markdown), `None` when there is none.
fn is_broken(file: &str, doc: &str, target: &str, read: &dyn Fn(&Path) -> Option<String>) -> bool {
    let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
    let text = if path.is_empty() {
        Some(doc.to_string())
    } else {
        resolve(file, path).and_then(|p| read(&p))
    };
    let checks_heading = !fragment.is_empty() && (path.is_empty() || path.ends_with(".md"));
    match text {
        None => true,
        Some(t) => checks_heading && !anchors(&t).contains(fragment),
    }
}

/// The links of `file` that are broken: `file: (target)`.
fn broken_links(file: &str, doc: &str, read: &dyn Fn(&Path) -> Option<String>) -> Vec<String> {
    relative_links(doc)
        .into_iter()
        .filter(|target| is_broken(file, doc, target, read))
        .map(|t| format!("{file}: ({t})"))
        .collect()
}

fn read_repo(path: &Path) -> Option<String> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if !full.exists() {
        return None;
    }
    if full.extension().is_some_and(|e| e == "md") {
        return std::fs::read_to_string(full).ok();
    }
    Some(String::new())
}

#[test]
fn every_link_between_the_documents_resolves() {
    let broken: Vec<String> = documents()
        .iter()
        .flat_map(|f| broken_links(f, &shipped(f), &read_repo))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_link_to_a_missing_file_or_heading_is_found() {
    let other = "# Title\n\n## What `kubectl get` shows\n```\n# not a heading\n```\n";
    let read = |p: &Path| (p == Path::new("docs/other.md")).then(|| other.to_string());
    let doc = "# Here\n[a](other.md) [b](other.md#what-kubectl-get-shows) [c](#here)\n\
               [d](gone.md) [e](other.md#not-a-heading) [f](#nowhere) [g](../../x.md)\n\
               [h](https://example.com/x) [i](../docs/other.md#title)\n";
    assert_eq!(
        broken_links("docs/here.md", doc, &read),
        [
            "docs/here.md: (gone.md)",
            "docs/here.md: (other.md#not-a-heading)",
            "docs/here.md: (#nowhere)",
            "docs/here.md: (../../x.md)",
        ]
    );
}
