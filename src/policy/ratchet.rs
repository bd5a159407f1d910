//! What one admission request is judged by. Pure: the webhook ([`crate::admission::webhook`]) reads the
//! review, asks [`judge`], and does the only I/O (the opt-in image check) when told to.
//!
//! CREATE is judged in full: every ADR-006 rule ([`check`]), and the image check when
//! `--check-images` is on.
//!
//! UPDATE is *ratcheted*: an object that was admitted once can always be let go of. Without this,
//! a run admitted while the operator allowed `--max-cap 16Gi` (its path asks `sizeLimit: 8Gi`)
//! could never be deleted after a restart with `--max-cap 4Gi`: the finalizer release at the end
//! of the drain is an UPDATE, re-judging the unchanged spec denied it, and the run hung in
//! deletion for ever (issue #11). The same trap opens whenever a rule is tightened, or when an
//! image tag disappears under `--check-images`. So:
//!
//! - an UPDATE that leaves the spec alone (finalizers, annotations such as `skip-drain`, labels,
//!   owner references) runs no rule at all: it is always allowed ([`Scope::Unchanged`]);
//! - an UPDATE that changes the spec runs the update rules ([`check_update`]: `stop` is final,
//!   only `stop`, `ttlSecondsAfterFinished` and `readBack.retention` may change once the pod
//!   exists) and the spec rules, but a failure the stored
//!   spec already had — same rule, same field, same message, which quotes the offending value —
//!   is only a warning: a spec admitted earlier is never re-judged by a rule, or an operator
//!   setting, that changed since ([`Scope::Changed`]);
//! - the image is resolved only when `spec.image` itself changed;
//! - an object being deleted (`deletionTimestamp` set) is never denied by the spec rules or the
//!   image check ([`Scope::Deleting`]). The update rules still refuse a real edit of its spec
//!   (changing `readBack.paths` of a run whose pod is being drained would change what the drain
//!   reads), but they never fire on an update that leaves the spec alone, which is what every
//!   deletion-related update (the finalizer release, `skip-drain`) is.
//!
//! "Unchanged" is decided twice: first on the raw `.spec` JSON, before anything is parsed (so a
//! stored spec this build can no longer read — say after a downgrade — never blocks a metadata
//! update), then on the parsed spec (so `stop: false` written out, or left out, is the same spec).

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use super::rules::{check, check_update, sort_findings, Finding, RuleSettings, Severity};
use crate::api::SandboxRunSpec;

/// The stored object an UPDATE is compared with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stored<'a> {
    /// Its `.spec`, raw (an empty object when it has none).
    pub(crate) spec: &'a Value,
    /// Its status names the run's pod: the spec is frozen but for `stop`.
    pub(crate) pod_exists: bool,
}

/// One admission request, as far as the rules are concerned.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Review<'a> {
    /// A new object, with its raw `.spec`.
    Create {
        /// The object's `.spec`.
        spec: &'a Value,
    },
    /// A changed object.
    Update {
        /// The stored object; None when the review carries none.
        old: Option<Stored<'a>>,
        /// The new object's `.spec`.
        spec: &'a Value,
        /// The object (new or stored) has a `deletionTimestamp`.
        deleting: bool,
    },
}

/// Which rules ran, and why (for the log and the tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every rule: a CREATE, or an UPDATE whose stored spec is missing or unreadable.
    Full,
    /// An UPDATE that leaves the spec alone: no rule ran.
    Unchanged,
    /// An UPDATE that changes the spec: the update rules and the ratcheted spec rules ran.
    Changed,
    /// An UPDATE of an object being deleted: only the update rules ran.
    Deleting,
}

/// The verdict of the pure rules, and what the webhook must still do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Judgement {
    /// Which rules ran.
    pub(crate) scope: Scope,
    /// Findings, sorted ([`sort_findings`]); a `Fail` denies.
    pub(crate) findings: Vec<Finding>,
    /// The image to resolve against its registry when `--check-images` is on: the new object's
    /// image on CREATE, and on UPDATE only when it changed.
    pub(crate) resolve_image: Option<ImageCheck>,
    /// The stored spec did not parse (the new one is then judged in full); for the log.
    pub(crate) stored_unreadable: Option<String>,
}

/// An image the webhook resolves (no pull), with the run's pull secrets for the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageCheck {
    /// `spec.image`, trimmed.
    pub(crate) image: String,
    /// `spec.imagePullSecrets`.
    pub(crate) pull_secrets: Vec<String>,
}

/// The new object's spec is not a SandboxRun spec: the review is denied as invalid.
#[derive(Debug, Error)]
#[error("the object is not a valid SandboxRun: {0}")]
pub(crate) struct InvalidSpec(#[source] serde_json::Error);

/// Decides what a review is judged by, and judges it.
pub(crate) fn judge(review: Review<'_>, settings: &RuleSettings) -> Result<Judgement, InvalidSpec> {
    let (old, raw_new, deleting) = match review {
        Review::Create { spec } => return full(&parse(spec)?, settings, None),
        Review::Update {
            old,
            spec,
            deleting,
        } => (old, spec, deleting),
    };
    if old.is_some_and(|o| o.spec == raw_new) {
        return Ok(allowed(Scope::Unchanged));
    }
    let new = match parse(raw_new) {
        Ok(new) => new,
        // A spec we cannot read on an object on its way out: refusing it could hold the deletion
        // (the CRD schema has already checked its shape).
        Err(_) if deleting => return Ok(allowed(Scope::Deleting)),
        Err(e) => return Err(e),
    };
    let Some(old) = old else {
        return if deleting {
            Ok(allowed(Scope::Deleting))
        } else {
            full(&new, settings, None)
        };
    };
    let stored = match SandboxRunSpec::deserialize(old.spec) {
        Ok(s) => s,
        Err(e) if deleting => {
            return Ok(Judgement {
                stored_unreadable: Some(e.to_string()),
                ..allowed(Scope::Deleting)
            })
        }
        // The spec rules still protect the new spec; the update rules cannot run.
        Err(e) => return full(&new, settings, Some(e.to_string())),
    };
    if stored == new {
        return Ok(allowed(Scope::Unchanged));
    }
    let mut findings = check_update(&stored, &new, old.pod_exists);
    if deleting {
        return Ok(Judgement {
            findings,
            ..allowed(Scope::Deleting)
        });
    }
    let before = check(&stored, settings);
    findings.extend(
        check(&new, settings)
            .into_iter()
            .map(|f| ratchet(f, &before)),
    );
    sort_findings(&mut findings);
    let resolve_image = image_check(&new).filter(|c| image_of(&stored) != Some(c.image.as_str()));
    Ok(Judgement {
        scope: Scope::Changed,
        findings,
        resolve_image,
        stored_unreadable: None,
    })
}

/// The typed spec, read from the review's JSON in place (no copy of the tree on the hot path).
fn parse(spec: &Value) -> Result<SandboxRunSpec, InvalidSpec> {
    SandboxRunSpec::deserialize(spec).map_err(InvalidSpec)
}

fn allowed(scope: Scope) -> Judgement {
    Judgement {
        scope,
        findings: Vec::new(),
        resolve_image: None,
        stored_unreadable: None,
    }
}

fn full(
    new: &SandboxRunSpec,
    settings: &RuleSettings,
    stored_unreadable: Option<String>,
) -> Result<Judgement, InvalidSpec> {
    Ok(Judgement {
        scope: Scope::Full,
        findings: check(new, settings),
        resolve_image: image_check(new),
        stored_unreadable,
    })
}

fn image_check(spec: &SandboxRunSpec) -> Option<ImageCheck> {
    image_of(spec).map(|image| ImageCheck {
        image: image.to_string(),
        pull_secrets: spec.image_pull_secrets.clone(),
    })
}

fn image_of(spec: &SandboxRunSpec) -> Option<&str> {
    spec.image
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
}

/// A failure the stored spec already had, word for word, becomes a warning: it was admitted.
fn ratchet(finding: Finding, before: &[Finding]) -> Finding {
    let admitted = finding.is_fail()
        && before.iter().any(|b| {
            b.is_fail()
                && b.rule == finding.rule
                && b.field == finding.field
                && b.message == finding.message
        });
    if !admitted {
        return finding;
    }
    Finding {
        severity: Severity::Warn,
        message: format!(
            "{} (unchanged since the run was admitted, so not re-judged)",
            finding.message
        ),
        ..finding
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::CapSettings;
    use crate::policy::rules::ids;
    use serde_json::json;

    const GI: u64 = 1 << 30;
    const IMAGE: &str =
        "ghcr.io/acme/tool@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const OTHER_IMAGE: &str =
        "ghcr.io/acme/tool@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// The operator after `--max-cap` went from 16Gi down to 4Gi.
    fn tightened() -> RuleSettings {
        RuleSettings {
            caps: CapSettings {
                default_bytes: GI,
                max_bytes: 4 * GI,
            },
            ..RuleSettings::default()
        }
    }

    /// A run admitted under `--max-cap 16Gi`: its path asks for 8Gi.
    fn admitted_at_16gi() -> Value {
        json!({
            "image": IMAGE,
            "user": "1000:1000",
            "readBack": {"paths": [{"path": "/work/out", "sizeLimit": "8Gi"}]},
        })
    }

    fn with(spec: &Value, field: &str, value: Value) -> Value {
        let mut s = spec.clone();
        s[field] = value;
        s
    }

    fn update(old: &Value, new: &Value, pod_exists: bool, deleting: bool) -> Judgement {
        judge(
            Review::Update {
                old: Some(Stored {
                    spec: old,
                    pod_exists,
                }),
                spec: new,
                deleting,
            },
            &tightened(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn image(j: &Judgement) -> Option<&str> {
        j.resolve_image.as_ref().map(|c| c.image.as_str())
    }

    fn failures(j: &Judgement) -> Vec<&'static str> {
        j.findings
            .iter()
            .filter(|f| f.is_fail())
            .map(|f| f.rule)
            .collect()
    }

    #[test]
    fn the_fixture_is_refused_on_create_under_the_tightened_cap() {
        // What makes the tests below meaningful: today's rules refuse the admitted spec.
        let j = judge(
            Review::Create {
                spec: &admitted_at_16gi(),
            },
            &tightened(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(j.scope, Scope::Full);
        assert_eq!(failures(&j), [ids::READ_BACK_SIZE_LIMIT]);
        assert_eq!(image(&j), Some(IMAGE));
    }

    #[test]
    fn an_identical_spec_is_not_re_judged_after_the_cap_was_tightened() {
        let spec = admitted_at_16gi();
        for pod_exists in [false, true] {
            let j = update(&spec, &spec, pod_exists, false);
            assert_eq!(j.scope, Scope::Unchanged);
            assert!(j.findings.is_empty(), "{:#?}", j.findings);
            assert_eq!(j.resolve_image, None, "an unchanged image is not resolved");
        }
    }

    #[test]
    fn the_finalizer_release_of_a_deleting_run_is_allowed() {
        // Removing the finalizer changes metadata only: the spec in the review is the stored one.
        let spec = admitted_at_16gi();
        let j = update(&spec, &spec, true, true);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
        assert_eq!(j.resolve_image, None);
        // Even when this build cannot read the stored spec any more (an enum value it does not
        // know), nothing is parsed and nothing is refused.
        let unreadable = with(&spec, "hostState", json!("sometimes"));
        for deleting in [false, true] {
            let j = update(&unreadable, &unreadable, true, deleting);
            assert_eq!(j.scope, Scope::Unchanged);
            assert!(j.findings.is_empty());
        }
    }

    #[test]
    fn a_spec_that_differs_only_in_how_defaults_are_written_is_unchanged() {
        let old = admitted_at_16gi();
        let new = with(&old, "stop", json!(false));
        assert_ne!(old, new, "the raw JSON differs");
        let j = update(&old, &new, true, false);
        assert_eq!(j.scope, Scope::Unchanged);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
    }

    #[test]
    fn a_real_spec_edit_of_a_started_run_is_still_denied() {
        let old = admitted_at_16gi();
        let new = with(&old, "image", json!(OTHER_IMAGE));
        let j = update(&old, &new, true, false);
        assert_eq!(j.scope, Scope::Changed);
        assert_eq!(failures(&j), [ids::UPDATE_IMMUTABLE]);
        assert_eq!(j.findings[0].field, "spec.image");
        // stop may still be set, and is final.
        let stopped = with(&old, "stop", json!(true));
        assert!(failures(&update(&old, &stopped, true, false)).is_empty());
        let unstopped = with(&stopped, "stop", json!(false));
        assert_eq!(
            failures(&update(&stopped, &unstopped, true, false)),
            [ids::UPDATE_STOP_FINAL]
        );
    }

    #[test]
    fn stopping_a_run_admitted_under_a_longer_max_drain_timeout_is_allowed() {
        let settings = RuleSettings {
            max_drain_timeout: Some(std::time::Duration::from_secs(600)),
            ..RuleSettings::default()
        };
        let old = json!({
            "image": IMAGE,
            "user": "1000:1000",
            "readBack": {"paths": [{"path": "/work/out"}], "drainTimeout": "2h"},
        });
        let judge_with = |old: Option<&Value>, new: &Value| {
            let review = match old {
                None => Review::Create { spec: new },
                Some(old) => Review::Update {
                    old: Some(Stored {
                        spec: old,
                        pod_exists: true,
                    }),
                    spec: new,
                    deleting: false,
                },
            };
            judge(review, &settings).unwrap_or_else(|e| panic!("{e}"))
        };
        // A new run asking for more than the maximum is refused, with the hint.
        assert_eq!(
            failures(&judge_with(None, &old)),
            [ids::READ_BACK_DRAIN_TIMEOUT]
        );
        // One admitted before the maximum was lowered can still be stopped.
        let stopped = with(&old, "stop", json!(true));
        let j = judge_with(Some(&old), &stopped);
        assert!(failures(&j).is_empty(), "{:#?}", j.findings);
        assert!(j
            .findings
            .iter()
            .any(|f| f.rule == ids::READ_BACK_DRAIN_TIMEOUT && f.severity == Severity::Warn));
    }

    #[test]
    fn stopping_a_run_admitted_under_a_looser_cap_warns_but_is_allowed() {
        let old = admitted_at_16gi();
        let new = with(&old, "stop", json!(true));
        let j = update(&old, &new, true, false);
        assert_eq!(j.scope, Scope::Changed);
        assert!(failures(&j).is_empty(), "{:#?}", j.findings);
        let w = j
            .findings
            .iter()
            .find(|f| f.rule == ids::READ_BACK_SIZE_LIMIT)
            .unwrap_or_else(|| panic!("the ratcheted failure is still shown: {:#?}", j.findings));
        assert_eq!(w.severity, Severity::Warn);
        assert_eq!(w.field, "spec.readBack.paths[0].sizeLimit");
        assert!(w.message.contains("not re-judged"), "{w:?}");
    }

    #[test]
    fn before_the_pod_exists_an_edit_is_judged_but_only_new_failures_deny() {
        let old = admitted_at_16gi();
        // Another field changes: the old 8Gi stays admitted.
        let args = with(&old, "args", json!(["--fast"]));
        let j = update(&old, &args, false, false);
        assert!(failures(&j).is_empty(), "{:#?}", j.findings);
        // The cap itself changes to another value above today's maximum: judged, refused.
        let mut raised = old.clone();
        raised["readBack"]["paths"][0]["sizeLimit"] = json!("10Gi");
        assert_eq!(
            failures(&update(&old, &raised, false, false)),
            [ids::READ_BACK_SIZE_LIMIT]
        );
        // A new failure elsewhere is refused too.
        let root = with(&old, "user", json!("0"));
        assert_eq!(
            failures(&update(&old, &root, false, false)),
            [ids::USER_NON_ROOT]
        );
    }

    #[test]
    fn the_image_is_resolved_on_update_only_when_it_changed() {
        let old = admitted_at_16gi();
        let moved = with(&old, "image", json!(OTHER_IMAGE));
        assert_eq!(
            image(&update(&old, &moved, false, false)),
            Some(OTHER_IMAGE)
        );
        let args = with(&old, "args", json!(["x"]));
        assert_eq!(update(&old, &args, false, false).resolve_image, None);
        let padded = with(&old, "image", json!(format!(" {IMAGE} ")));
        assert_eq!(
            update(&old, &padded, false, false).resolve_image,
            None,
            "the same image, padded"
        );
        assert_eq!(update(&old, &moved, false, true).resolve_image, None);
    }

    #[test]
    fn a_deleting_object_is_never_denied_by_the_spec_rules() {
        let old = admitted_at_16gi();
        // Before the pod exists, even an edit that today's rules refuse passes while deleting.
        let root = with(&old, "user", json!("0"));
        let j = update(&old, &root, false, true);
        assert_eq!(j.scope, Scope::Deleting);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
        // A new spec this build cannot read is not refused either.
        let odd = with(&old, "hostState", json!("sometimes"));
        assert!(update(&old, &odd, true, true).findings.is_empty());
        let j = judge(
            Review::Update {
                old: None,
                spec: &odd,
                deleting: true,
            },
            &tightened(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(j.findings.is_empty());
        // The update rules still protect the drain in progress from a real edit.
        let moved = with(&old, "image", json!(OTHER_IMAGE));
        assert_eq!(
            failures(&update(&old, &moved, true, true)),
            [ids::UPDATE_IMMUTABLE]
        );
    }

    #[test]
    fn without_a_readable_stored_spec_the_new_one_is_judged_in_full() {
        let new = with(&admitted_at_16gi(), "args", json!(["x"]));
        let j = judge(
            Review::Update {
                old: None,
                spec: &new,
                deleting: false,
            },
            &tightened(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(j.scope, Scope::Full);
        assert_eq!(failures(&j), [ids::READ_BACK_SIZE_LIMIT]);
        let unreadable = with(&admitted_at_16gi(), "hostState", json!("sometimes"));
        let j = update(&unreadable, &new, true, false);
        assert_eq!(j.scope, Scope::Full);
        assert!(j.stored_unreadable.is_some());
        assert_eq!(failures(&j), [ids::READ_BACK_SIZE_LIMIT]);
    }

    #[test]
    fn a_new_spec_that_does_not_parse_is_invalid_unless_the_object_is_deleting() {
        let old = admitted_at_16gi();
        let odd = with(&old, "hostState", json!("sometimes"));
        let update = |deleting| {
            judge(
                Review::Update {
                    old: Some(Stored {
                        spec: &old,
                        pod_exists: false,
                    }),
                    spec: &odd,
                    deleting,
                },
                &tightened(),
            )
        };
        let e = update(false).map(|j| j.scope).err();
        assert!(
            e.is_some_and(|e| e.to_string().contains("sometimes")),
            "an edit to an unreadable spec is refused as invalid"
        );
        assert!(update(true).is_ok());
        assert!(judge(Review::Create { spec: &odd }, &tightened()).is_err());
    }
}
