//! Runs the admission engine (docs/contract.md, "ADR-006") and `doctor --strict` over every
//! manifest in `tests/admission-corpus/` and checks each against the verdict its first line declares:
//! `# expect: ok|warn|fail|usage [rule-id ...] [(schema)]`.
//! The rule ids listed are exactly the set of rule ids the engine reports for the file, together
//! with what `doctor` judges as the apiserver would before the engine (`unknown-field`,
//! `invalid-value`, `api-version-kind`).

use std::collections::BTreeSet;

use sandboxrun_operator::api::SandboxRun;
use sandboxrun_operator::doctor::{self, DoctorArgs, Output};
use sandboxrun_operator::policy::{check, Finding, RuleSettings, Severity};

use crate::support::*;

/// The SandboxRuns of a file (and SandboxRun-like documents), each with what the cluster judges
/// before the webhook (`doctor::document_findings`: apiVersion/kind, unknown fields, values outside
/// their type or enum, which are left out of what is judged); None when the file is a usage error
/// (does not parse, or is no SandboxRun even without those values).
fn runs(text: &str) -> Option<Vec<(SandboxRun, Vec<Finding>)>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc).ok()?;
        let before = doctor::document_findings(&value);
        if value.get("kind").and_then(|k| k.as_str()) != Some("SandboxRun") && before.is_empty() {
            continue;
        }
        let judged = doctor::without_invalid_values(&value);
        out.push((serde_yaml::from_value(judged).ok()?, before));
    }
    Some(out)
}

#[test]
fn corpus_is_big_enough_and_covers_every_verdict() {
    let files = corpus();
    assert!(files.len() >= 40, "only {} corpus files", files.len());
    for prefix in ["ok-", "warn-", "fail-", "usage-"] {
        assert!(
            files.iter().any(|f| f
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))),
            "no {prefix} file"
        );
    }
}

#[test]
fn engine_verdicts_match_the_corpus() {
    let mut problems = Vec::new();
    for path in corpus() {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let want = expectation(&path, &text);
        let Some(runs) = runs(&text) else {
            if want.verdict != "usage" {
                problems.push(format!(
                    "{}: does not parse but expects {}",
                    path.display(),
                    want.verdict
                ));
            }
            continue;
        };
        if want.verdict == "usage" {
            problems.push(format!(
                "{}: parses but expects a usage error",
                path.display()
            ));
            continue;
        }
        assert!(
            !runs.is_empty(),
            "{}: no SandboxRun in the file",
            path.display()
        );
        let findings: Vec<_> = runs
            .iter()
            .flat_map(|(r, before)| {
                before
                    .iter()
                    .cloned()
                    .chain(check(&r.spec, &RuleSettings::default()))
            })
            .collect();
        for f in &findings {
            assert!(
                !f.hint.is_empty(),
                "{}: finding without hint {f:?}",
                path.display()
            );
        }
        let got_rules: BTreeSet<String> = findings.iter().map(|f| f.rule.to_string()).collect();
        let got = if findings.iter().any(|f| f.severity == Severity::Fail) {
            "fail"
        } else if findings.is_empty() {
            "ok"
        } else {
            "warn"
        };
        if got != want.verdict || got_rules != want.rules {
            problems.push(format!(
                "{}: expected {} {:?}, got {got} {:?}",
                path.display(),
                want.verdict,
                want.rules,
                got_rules
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "corpus mismatches:\n{}",
        problems.join("\n")
    );
}

#[tokio::test]
async fn doctor_strict_exit_codes_match_the_corpus() {
    let mut problems = Vec::new();
    for path in corpus() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let want = expectation(&path, &text);
        let expected_code = match want.verdict.as_str() {
            "ok" | "warn" => 0,
            "fail" => 1,
            _ => 2,
        };
        let args = DoctorArgs {
            files: vec![path.display().to_string()],
            filename: Vec::new(),
            output: Output::Text,
            strict: true,
            ..Default::default()
        };
        let mut out = Vec::new();
        let code = doctor::run(args, RuleSettings::default(), &mut out).await;
        let report = String::from_utf8_lossy(&out);
        if code != expected_code {
            problems.push(format!(
                "{}: exit {code}, expected {expected_code}\n{report}",
                path.display()
            ));
        }
        for rule in &want.rules {
            if !report.contains(rule.as_str()) {
                problems.push(format!(
                    "{}: report does not name {rule}\n{report}",
                    path.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "doctor mismatches:\n{}",
        problems.join("\n")
    );
}
