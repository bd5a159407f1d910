//! The admission corpus (`tests/admission-corpus/*.yaml`): each file's first line declares the
//! verdict every checker must reach, `# expect: ok|warn|fail|usage [rule-id ...] [(schema)]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sandboxrun_operator::api::SandboxRun;

use super::repo;

/// `# expect: <verdict> [rules…] [(schema)]`.
pub struct Expectation {
    /// ok, warn, fail or usage.
    pub verdict: String,
    /// Exactly the rule ids the engine reports for the file.
    pub rules: BTreeSet<String>,
    /// The apiserver refuses the file before the webhook sees it: the CRD schema, its CEL rules, an
    /// unknown field (strict decoding), or a kind it does not serve.
    pub schema: bool,
}

/// The corpus directory.
pub fn corpus_dir() -> PathBuf {
    repo().join("tests/admission-corpus")
}

/// Every corpus file, sorted.
pub fn corpus() -> Vec<PathBuf> {
    let dir = corpus_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The expectation the first line of `text` (the file at `path`) declares; panics when it is
/// missing or malformed, or when the file's name does not start with its verdict.
pub fn expectation(path: &Path, text: &str) -> Expectation {
    let first = text.lines().next().unwrap_or_default();
    let rest = first
        .strip_prefix("# expect:")
        .unwrap_or_else(|| panic!("{}: first line must be `# expect: ...`", path.display()));
    let mut words = rest.split_whitespace();
    let verdict = words.next().unwrap_or_default().to_string();
    assert!(
        ["ok", "warn", "fail", "usage"].contains(&verdict.as_str()),
        "{}: bad verdict {verdict}",
        path.display()
    );
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    assert!(
        name.starts_with(&format!("{verdict}-")),
        "{name}: file name must start with its verdict"
    );
    let mut rules = BTreeSet::new();
    let mut schema = false;
    for w in words {
        if w == "(schema)" {
            schema = true;
        } else {
            assert!(!w.starts_with('('), "{}: unknown note {w}", path.display());
            rules.insert(w.to_string());
        }
    }
    Expectation {
        verdict,
        rules,
        schema,
    }
}

/// The SandboxRuns of a corpus file; None when the file is a usage error (does not parse or
/// deserialize).
pub fn corpus_runs(text: &str) -> Option<Vec<SandboxRun>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).ok()?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("SandboxRun") {
            continue;
        }
        // Values outside their type or enum are doctor's `invalid-value` findings (the
        // apiserver's own on a live cluster); the engine judges the rest.
        let judged = sandboxrun_operator::doctor::without_invalid_values(&value);
        out.push(serde_yaml::from_value(judged).ok()?);
    }
    Some(out)
}
