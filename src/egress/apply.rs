//! Puts a run's egress enforcement in place before its pod exists (docs/contract.md "ADR-006
//! network rules: validated and enforced"): the NetworkPolicy is applied (server-side apply, one
//! field manager) first, so the pod never runs a moment unfiltered; the Event says what is
//! enforced and by whom. With `--network-policy=unenforced-refuse` a run that asks for egress
//! restrictions does not start; with `unenforced-warn` it starts with a Warning.

use jiff::Timestamp;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::api::{Phase, SandboxRun};
use crate::controller::conditions::{self, set_condition, READY};
use crate::controller::events::{
    EGRESS_POLICY_APPLIED as REASON_EGRESS_POLICY_APPLIED,
    EGRESS_POLICY_UNENFORCED as REASON_EGRESS_POLICY_UNENFORCED, EVENT_NOTE_LIMIT,
};
use crate::controller::{Context, ControllerError, MANAGER};
use crate::egress::mode::{egress_of, Egress};
use crate::egress::policy::build_policy;
use crate::egress::settings::{EgressSettings, PolicyEnforcement};

/// What the Event says is enforced for a run (pure, for the note and the tests).
pub fn describe(run: &SandboxRun, egress: &Egress, settings: &EgressSettings) -> String {
    let name = crate::egress::policy::policy_name(&run.name_any());
    let by = match settings.enforcement {
        PolicyEnforcement::Enforced => "enforced by the cluster's network plugin",
        _ => "NOT enforced: the cluster admin declared NetworkPolicy unenforced here",
    };
    match egress {
        Egress::Open => "egress is open: no NetworkPolicy".to_string(),
        Egress::DenyAll => {
            format!("NetworkPolicy {name} denies all egress and ingress ({by})")
        }
        Egress::Filtered { rules, .. } => {
            let hosts = match &settings.proxy {
                Some(p) if settings.token_secret.is_some() => {
                    format!("host rules are judged by the egress proxy {}", p.url)
                }
                _ => "host rules are NOT enforced: no egress proxy is configured".to_string(),
            };
            format!(
                "NetworkPolicy {name} allows egress only to DNS, the egress proxy and the address \
                 ranges of the {} rule(s), denies ingress ({by}); {hosts}",
                rules.len()
            )
        }
    }
}

/// Run before the pod is created: Ok(true) to go on creating it, Ok(false) when the run must not
/// start (refused; its status says why). A policy the apiserver refuses is an error:
/// the pod is not created without it.
pub(crate) async fn before_pod(ctx: &Context, run: &SandboxRun) -> Result<bool, ControllerError> {
    let settings = &ctx.pod.egress;
    // A rule that does not parse (admission refuses it; a run admitted before the webhook, or
    // with it off, may carry one) is an InvalidSpec like any spec the pod cannot be built from.
    let egress = match egress_of(run) {
        Ok(e) => e,
        Err(e) => {
            let msg = format!("cannot enforce spec.network: {e}");
            refuse(ctx, run, conditions::REASON_INVALID_SPEC, &msg).await?;
            return Ok(false);
        }
    };
    if !egress.is_restricted() {
        return Ok(true);
    }
    match settings.enforcement {
        PolicyEnforcement::UnenforcedRefuse => {
            let msg = format!(
                "spec.network asks for egress restrictions and this cluster's NetworkPolicy is \
                 declared unenforced (--network-policy={}): the run is not started",
                settings.enforcement
            );
            refuse(ctx, run, REASON_EGRESS_POLICY_UNENFORCED, &msg).await?;
            return Ok(false);
        }
        PolicyEnforcement::UnenforcedWarn => {
            let msg = format!(
                "spec.network asks for egress restrictions and this cluster's NetworkPolicy is \
                 declared unenforced (--network-policy={}): the run starts, its egress may not \
                 be filtered",
                settings.enforcement
            );
            publish(
                ctx,
                run,
                EventType::Warning,
                REASON_EGRESS_POLICY_UNENFORCED,
                &msg,
            )
            .await;
        }
        PolicyEnforcement::Enforced => {}
    }
    let policy = match build_policy(run, settings) {
        Ok(Some(p)) => p,
        Ok(None) => return Ok(true),
        Err(e) => {
            let msg = format!("cannot enforce spec.network: {e}");
            refuse(ctx, run, conditions::REASON_INVALID_SPEC, &msg).await?;
            return Ok(false);
        }
    };
    apply_policy(&ctx.client, &policy).await?;
    let note = describe(run, &egress, settings);
    info!(run = %run.name_any(), policy = ?policy.metadata.name, "egress policy applied");
    publish(
        ctx,
        run,
        EventType::Normal,
        REASON_EGRESS_POLICY_APPLIED,
        &note,
    )
    .await;
    Ok(true)
}

/// Server-side applies `policy` in its namespace.
pub(crate) async fn apply_policy(
    client: &kube::Client,
    policy: &NetworkPolicy,
) -> Result<(), ControllerError> {
    let ns = policy.metadata.namespace.clone().unwrap_or_default();
    let name = policy.metadata.name.clone().unwrap_or_default();
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let mut body = policy.clone();
    body.metadata.managed_fields = None;
    let body = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": body.metadata,
        "spec": body.spec,
    });
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|source| ControllerError::Kube {
        action: format!("apply NetworkPolicy {name}"),
        source,
    })
}

async fn refuse(
    ctx: &Context,
    run: &SandboxRun,
    reason: &'static str,
    msg: &str,
) -> Result<(), ControllerError> {
    let mut status = run.status.clone().unwrap_or_default();
    if status.message.as_deref() == Some(msg) {
        return Ok(());
    }
    warn!(run = %run.name_any(), reason, "{msg}");
    publish(ctx, run, EventType::Warning, reason, msg).await;
    status.observed_generation = run.metadata.generation;
    status.phase = Some(Phase::Pending);
    status.message = Some(msg.to_string());
    set_condition(
        &mut status.conditions,
        READY,
        false,
        reason,
        msg,
        run.metadata.generation,
        Timestamp::now(),
    );
    let ns = run.namespace().unwrap_or_default();
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "status": status,
    });
    match runs
        .patch_status(
            &run.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
        Err(source) => Err(ControllerError::Kube {
            action: format!("apply status of {}", run.name_any()),
            source,
        }),
    }
}

async fn publish(ctx: &Context, run: &SandboxRun, type_: EventType, reason: &str, note: &str) {
    let mut note = note.to_string();
    if note.len() > EVENT_NOTE_LIMIT {
        let mut cut = EVENT_NOTE_LIMIT;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "ApplyEgressPolicy".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &run.object_ref(&())).await {
        warn!(run = %run.name_any(), reason, error = %e, "could not publish Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NetworkMode, NetworkPolicy as NetSpec, SandboxRunSpec};

    #[test]
    fn the_note_says_what_is_enforced_and_by_whom() {
        let run = SandboxRun::new(
            "r",
            SandboxRunSpec {
                network: Some(NetSpec {
                    mode: NetworkMode::Allowlist,
                    rules: vec!["x.com".into()],
                }),
                ..SandboxRunSpec::default()
            },
        );
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
}
