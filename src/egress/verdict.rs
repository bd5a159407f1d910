//! What a run's `spec.network` means for its pod, before the pod exists (docs/contract.md
//! "ADR-006 network rules: validated and enforced"): open egress, a NetworkPolicy to apply first
//! (so the pod never runs a moment unfiltered), that policy with a warning that this cluster does
//! not enforce it (`--network-policy=unenforced-warn`), or a refusal: the run does not start
//! (`unenforced-refuse`, or rules that cannot be enforced). Pure: the controller's plan turns the
//! verdict into Events, a status and the effect that applies the policy.

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use serde_json::json;

use crate::api::{NetworkMode, SandboxRun};
use crate::egress::mode::{egress_of, Egress};
use crate::egress::policy::build_policy;
use crate::egress::settings::{EgressSettings, PolicyEnforcement};

/// Why a run with egress restrictions must not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its rules cannot be enforced (they do not parse, or the policy cannot be built): an
    /// invalid spec like any the pod cannot be built from.
    InvalidSpec,
    /// This cluster's NetworkPolicy is declared unenforced and restricted runs are refused.
    Unenforced,
}

/// What to do about a run's egress before its pod is created.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum EgressVerdict {
    /// Egress is open: no NetworkPolicy.
    Open,
    /// Apply `policy` before the pod, then say what is enforced (`note`); `unenforced`: first
    /// warn that this cluster does not enforce NetworkPolicy (the run starts anyway).
    Apply {
        /// The run's NetworkPolicy.
        policy: Box<NetworkPolicy>,
        /// What is enforced and by whom ([`describe`]).
        note: String,
        /// The warning of `--network-policy=unenforced-warn`.
        unenforced: Option<String>,
    },
    /// The run must not start; `message` says why.
    Refuse {
        /// Why.
        refusal: Refusal,
        /// In words, for the status and the Event.
        message: String,
    },
}

/// Judges `run`'s `spec.network` under the operator's egress `settings`.
pub(crate) fn verdict(run: &SandboxRun, settings: &EgressSettings) -> EgressVerdict {
    // A rule that does not parse (admission refuses it; a run admitted before the webhook, or
    // with it off, may carry one) is an InvalidSpec like any spec the pod cannot be built from.
    let egress = match egress_of(run) {
        Ok(e) => e,
        Err(e) => return cannot_enforce(&e),
    };
    if !egress.is_restricted() {
        return EgressVerdict::Open;
    }
    let unenforced = match settings.enforcement {
        PolicyEnforcement::UnenforcedRefuse => {
            return EgressVerdict::Refuse {
                refusal: Refusal::Unenforced,
                message: format!(
                    "spec.network asks for egress restrictions and this cluster's NetworkPolicy \
                     is declared unenforced (--network-policy={}): the run is not started",
                    settings.enforcement
                ),
            }
        }
        PolicyEnforcement::UnenforcedWarn => Some(format!(
            "spec.network asks for egress restrictions and this cluster's NetworkPolicy is \
             declared unenforced (--network-policy={}): the run starts, its egress may not \
             be filtered",
            settings.enforcement
        )),
        PolicyEnforcement::Enforced => None,
    };
    match build_policy(run, settings) {
        Ok(Some(policy)) => EgressVerdict::Apply {
            policy: Box::new(policy),
            note: describe(run, &egress, settings),
            unenforced,
        },
        Ok(None) => EgressVerdict::Open,
        Err(e) => cannot_enforce(&e),
    }
}

fn cannot_enforce(e: &impl std::fmt::Display) -> EgressVerdict {
    EgressVerdict::Refuse {
        refusal: Refusal::InvalidSpec,
        message: format!("cannot enforce spec.network: {e}"),
    }
}

/// The body of the server-side apply of `policy` (no managedFields).
pub(crate) fn apply_body(policy: &NetworkPolicy) -> serde_json::Value {
    let mut metadata = policy.metadata.clone();
    metadata.managed_fields = None;
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": policy.spec,
    })
}

/// What the Event says is enforced for a run (pure, for the note and the tests).
pub(crate) fn describe(run: &SandboxRun, egress: &Egress, settings: &EgressSettings) -> String {
    let name = crate::egress::policy::policy_name(&run.name_any());
    let by = match settings.enforcement {
        PolicyEnforcement::Enforced => "enforced by the cluster's network plugin",
        _ => "NOT enforced: the cluster admin declared NetworkPolicy unenforced here",
    };
    match egress {
        Egress::Open => "egress is open: no NetworkPolicy".to_string(),
        Egress::DenyAll => match settings.deny_all_anchor() {
            Some(anchor) => format!(
                "NetworkPolicy {name} denies all ingress and all egress but the egress proxy \
                 {anchor}, which refuses every request of this run ({by})"
            ),
            None => format!("NetworkPolicy {name} denies all egress and ingress ({by})"),
        },
        Egress::Filtered { mode, rules } => {
            let hosts = match &settings.proxy {
                Some(p) if settings.token_secret.is_some() => {
                    format!("host rules are judged by the egress proxy {}", p.url)
                }
                _ => "host rules are NOT enforced: no egress proxy is configured".to_string(),
            };
            let ranges = if *mode == NetworkMode::Denylist && !settings.denylist_wide {
                "the address ranges its `!` rules allow explicitly (a denylist never widens its \
                 namespace's policies)"
            } else {
                "the address ranges its rules allow"
            };
            format!(
                "NetworkPolicy {name} allows egress only to DNS, the egress proxy and {ranges} \
                 ({} rule(s)), denies ingress ({by}); {hosts}",
                rules.len()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NetworkMode, SandboxRunSpec};

    fn filtered_run() -> SandboxRun {
        crate::testkit::sandbox_run("r")
            .namespace("ns")
            .uid("u1")
            .network(NetworkMode::Allowlist, &["x.com"])
            .build()
    }

    #[test]
    fn the_note_says_what_is_enforced_and_by_whom() {
        let run = filtered_run();
        let egress = egress_of(&run).unwrap();
        let note = describe(&run, &egress, &EgressSettings::default());
        assert!(note.contains("r-sbr-egress"), "{note}");
        assert!(
            note.contains("enforced by the cluster's network plugin"),
            "{note}"
        );
        assert!(note.contains("host rules are NOT enforced"), "{note}");
        let warn = EgressSettings {
            enforcement: PolicyEnforcement::UnenforcedWarn,
            ..EgressSettings::default()
        };
        assert!(describe(&run, &Egress::DenyAll, &warn).contains("NOT enforced"));
    }

    #[test]
    fn open_warn_refuse_and_apply_follow_the_enforcement_setting() {
        let open = SandboxRun::new("o", SandboxRunSpec::default());
        assert_eq!(
            verdict(&open, &EgressSettings::default()),
            EgressVerdict::Open
        );
        let run = filtered_run();
        match verdict(&run, &EgressSettings::default()) {
            EgressVerdict::Apply {
                policy, unenforced, ..
            } => {
                assert_eq!(policy.metadata.name.as_deref(), Some("r-sbr-egress"));
                assert_eq!(unenforced, None);
            }
            other => panic!("{other:?}"),
        }
        let warn = EgressSettings {
            enforcement: PolicyEnforcement::UnenforcedWarn,
            ..EgressSettings::default()
        };
        assert!(matches!(
            verdict(&run, &warn),
            EgressVerdict::Apply {
                unenforced: Some(_),
                ..
            }
        ));
        let refuse = EgressSettings {
            enforcement: PolicyEnforcement::UnenforcedRefuse,
            ..EgressSettings::default()
        };
        assert!(matches!(
            verdict(&run, &refuse),
            EgressVerdict::Refuse {
                refusal: Refusal::Unenforced,
                ..
            }
        ));
        let mut bad = filtered_run();
        if let Some(net) = bad.spec.network.as_mut() {
            net.rules = vec!["not a rule at all ::".into()];
        }
        assert!(matches!(
            verdict(&bad, &EgressSettings::default()),
            EgressVerdict::Refuse {
                refusal: Refusal::InvalidSpec,
                ..
            }
        ));
    }

    #[test]
    fn the_apply_body_carries_no_managed_fields() {
        let EgressVerdict::Apply { mut policy, .. } =
            verdict(&filtered_run(), &EgressSettings::default())
        else {
            panic!("a filtered run gets a policy");
        };
        policy.metadata.managed_fields = Some(Vec::new());
        let body = apply_body(&policy);
        assert_eq!(body["kind"], "NetworkPolicy");
        assert!(body["metadata"].get("managedFields").is_none());
        assert_eq!(body["metadata"]["name"], "r-sbr-egress");
    }
}
