//! Planning the pod's creation: the pre-flight's and the egress verdicts turned into effects
//! (docs/contract.md ADR-006 §5, "ADR-006 network rules: validated and enforced"), a pod that
//! cannot be built, and what the apiserver's answer means (created, already there, refused).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::super::decide::Preflight;
use super::super::refusals;
use super::super::status::{ensure_pending_entries, image_unresolvable_status, pending_status};
use super::model::{CreationFacts, Inputs, StepPlan};
use super::model::{Effect, Plan, Requeue, LOOK_AGAIN_MARGIN};
use crate::api::SandboxRun;
use crate::controller::conditions::{
    REASON_INVALID_SPEC, REASON_POD_CREATED, REASON_RIGHTS_UNVERIFIED,
};
use crate::controller::events::{self, PlannedEvent};
use crate::egress::verdict::{EgressVerdict, Refusal};
use crate::pod::{self};

pub(super) fn create_pod(run: &SandboxRun, inputs: &Inputs<'_>) -> StepPlan {
    let now = inputs.now;
    // The apiserver refused this run's pod before: wait out the back-off (a watch event, such as
    // our own status write, must not turn it into a hot loop).
    if let Some(wait) = refusals::create_retry_wait(run, inputs.last_create_attempt, now) {
        return StepPlan::Carry(Box::new(Plan::wait(Requeue::After(
            wait + LOOK_AGAIN_MARGIN,
        ))));
    }
    // The rules first (docs/contract.md "The operator never builds a pod its own rules
    // refuse"): a run the webhook never judged (off, `failurePolicy: Ignore`, a namespace it
    // does not cover) is judged here, by the same engine, before any pod exists.
    let built = match refused_by_rules(run, inputs.rules) {
        Some(refusal) => Err(refusal),
        None => pod::build_pod(run, inputs.pod_settings).map_err(|e| e.to_string()),
    };
    // Its author's rights unverified (docs/contract.md "A run uses only its author's rights"):
    // held like a run its rules refuse, under its own reason.
    if let (Ok(_), Some(why)) = (&built, inputs.rights_unverified) {
        return StepPlan::Carry(Box::new(rights_unverified(run, why, now)));
    }
    match built {
        // An attempt that starts with its paths restored is parked in the launcher until then
        // (docs/contract.md "Pause, resume and fork").
        Ok(pod) => StepPlan::CreatePod(Box::new(super::restore::parked_if_due(
            run,
            pod,
            inputs.pod_settings,
        ))),
        // A malformed run is recorded and awaited (a spec change wakes it), not retried hot.
        Err(e) => StepPlan::Carry(Box::new(invalid_spec(
            run,
            &format!("cannot build the pod: {e}"),
            now,
        ))),
    }
}

/// The rules' refusal of `run` (`policy::refusals`, the webhook's and `doctor`'s engine) in
/// words; None when no rule fails.
pub(super) fn refused_by_rules(
    run: &SandboxRun,
    rules: &crate::policy::RuleSettings,
) -> Option<String> {
    crate::policy::refusals(&run.spec, rules)
        .map(|r| format!("the operator's admission rules refuse the spec: {r}"))
}

/// The refusal of `run` (as made from its template) by the platform's namespace policies that
/// govern its namespace (`facts.namespace_labels`, read whenever a policy selects by label), in
/// words; None when every governing policy passes. The webhook judges an admission with the same
/// engine; the controller judges again before any pod exists, since the webhook may be absent
/// or bypassed (docs/contract.md "The platform's namespace policies").
pub(crate) fn refused_by_namespace_policies(
    run: &SandboxRun,
    facts: &CreationFacts,
    policies: &[crate::policy::namespace_policy::Compiled],
) -> Option<String> {
    let labels = facts.namespace_labels.clone().unwrap_or_default();
    let violations = crate::policy::namespace_policy::violations(&run.spec, &labels, policies);
    let shown: Vec<String> = violations
        .iter()
        .map(|v| {
            format!(
                "rule {} at {}: {} (hint: {})",
                crate::policy::rules::ids::RUN_POLICY,
                v.field,
                v.message,
                v.hint
            )
        })
        .collect();
    (!shown.is_empty()).then(|| {
        format!(
            "the platform's namespace policies refuse the spec: {}",
            shown.join("; ")
        )
    })
}

/// A run held for its spec (`why`): no pod, `Ready=False InvalidSpec`, one Warning per distinct
/// message, awaited (a spec change wakes it), not retried hot.
pub(super) fn invalid_spec(run: &SandboxRun, why: &str, now: Timestamp) -> Plan {
    let mut events = Vec::new();
    if run.status.as_ref().and_then(|s| s.message.as_deref()) != Some(why) {
        events.push(PlannedEvent::warning(
            events::INVALID_SPEC,
            why,
            "CreatePod",
        ));
    }
    Plan {
        events,
        status: Some(pending_status(run, REASON_INVALID_SPEC, why, now)),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

/// The run's author's rights were not verified by an admission: no pod, `Ready=False
/// RightsUnverified`, one Warning per distinct message, awaited (re-applying it through the
/// webhook changes the run and wakes it).
pub(super) fn rights_unverified(run: &SandboxRun, why: &str, now: Timestamp) -> Plan {
    if run.status.as_ref().and_then(|s| s.message.as_deref()) == Some(why) {
        return Plan::wait(Requeue::AwaitChange);
    }
    Plan {
        events: vec![PlannedEvent::warning(
            events::RIGHTS_UNVERIFIED,
            why,
            "CreatePod",
        )],
        status: Some(pending_status(run, REASON_RIGHTS_UNVERIFIED, why, now)),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

/// The pod is created (`created`), or already existed (the apiserver answered 409).
pub(crate) fn pod_created(
    run: &SandboxRun,
    pod_name: &str,
    created: bool,
    settle: Duration,
    now: Timestamp,
) -> Plan {
    // A fresh run's pod is reported Pending only if it is still starting after `settle`
    // ([`track_pod`]): a pod that runs at once is written once, Running.
    if created && unreported(run) && !settle.is_zero() {
        return Plan {
            effects: vec![Effect::ForgetCreateAttempts, Effect::RememberUnreportedPod],
            ..Plan::wait(Requeue::After(settle + LOOK_AGAIN_MARGIN))
        };
    }
    let mut status = pending_status(run, REASON_POD_CREATED, "waiting for the pod to run", now);
    status.pod_name = Some(pod_name.to_string());
    // The attempt's backoff is over: its pod exists (docs/user-guide.md "Retries").
    status.next_attempt_time = None;
    ensure_pending_entries(run, &mut status);
    let (events, effects) = if created {
        (
            vec![pod_created_event(pod_name)],
            vec![Effect::ForgetCreateAttempts],
        )
    } else {
        (Vec::new(), Vec::new())
    };
    Plan {
        events,
        status: Some(status),
        effects,
        requeue: Requeue::AwaitChange,
    }
}

/// Whether nothing was ever reported about the run: it has no phase yet.
pub(super) fn unreported(run: &SandboxRun) -> bool {
    run.status.as_ref().and_then(|s| s.phase).is_none()
}

fn pod_created_event(pod_name: &str) -> PlannedEvent {
    PlannedEvent::normal(
        events::POD_CREATED,
        format!("created pod {pod_name}"),
        "CreatePod",
    )
    .about_pod()
}

/// The `Events API` action of the egress Events.
pub(super) const EGRESS_ACTION: &str = "ApplyEgressPolicy";

/// The plan of creating the run's pod `pod` (as the step's plan built it) from the facts the
/// prepare stage read: a store that cannot be used holds the run; else the pod gets its final
/// shape ([`shaped_pod`]) and its creation is planned with the pre-flight's and the egress
/// verdicts ([`create`]).
pub(crate) fn creation(
    run: &SandboxRun,
    pod: Pod,
    facts: CreationFacts,
    (egress, policies): (EgressVerdict, &[crate::policy::namespace_policy::Compiled]),
    now: Timestamp,
) -> Plan {
    if let Some(why) = &facts.store_unusable {
        return store_unusable(run, why, now);
    }
    if let Some(refusal) = refused_by_namespace_policies(run, &facts, policies) {
        return invalid_spec(run, &refusal, now);
    }
    let pod = shaped_pod(run, pod, &facts, policies);
    create(run, pod, facts.preflight, egress, now)
}

/// `pod` with its namespace policies' default runtime class when the run names none
/// (`facts.namespace_labels`: docs/contract.md "The platform's namespace policies") and placed on
/// the Kueue flavors it was admitted on (their nodeLabels and tolerations, as Kueue does for its
/// own jobs: docs/user-guide.md "Queueing with Kueue").
pub(crate) fn shaped_pod(
    run: &SandboxRun,
    pod: Pod,
    facts: &CreationFacts,
    policies: &[crate::policy::namespace_policy::Compiled],
) -> Pod {
    let pod = match &facts.namespace_labels {
        Some(labels) => crate::pod::with_namespace_default(pod, run, labels, policies),
        None => pod,
    };
    crate::kueue::with_flavors(pod, &facts.flavors)
}

/// Creating the run's `pod`, once the pre-flight judged its image (`preflight`, docs/contract.md
/// ADR-006 §5) and the run's egress was judged (`egress`, docs/contract.md "ADR-006 network
/// rules: validated and enforced"): a run whose image does not exist gets no pod and no
/// NetworkPolicy and fails at once; a run whose egress cannot be enforced is refused (no pod);
/// otherwise its NetworkPolicy is applied first, so the pod never runs unfiltered, then the pod
/// is created and the apiserver's answer planned by [`after`].
pub(crate) fn create(
    run: &SandboxRun,
    pod: Pod,
    preflight: Preflight,
    egress: EgressVerdict,
    now: Timestamp,
) -> Plan {
    let unverified = match preflight {
        Preflight::Proceed => None,
        Preflight::ProceedUnverified { message } => Some(image_unverified(&message)),
        Preflight::Unresolvable { message, hint } => {
            return image_unresolvable(run, &message, &hint, now)
        }
    };
    let mut effects = Vec::new();
    match egress {
        EgressVerdict::Open => {}
        EgressVerdict::Refuse { refusal, message } => {
            return egress_refused(run, refusal, &message, now)
        }
        EgressVerdict::Apply {
            policy,
            note,
            unenforced,
        } => effects.extend(egress_effects(policy, note, unenforced)),
    }
    effects.extend(unverified.map(Effect::Publish));
    effects.push(Effect::CreatePod(Box::new(pod)));
    Plan {
        effects,
        ..Plan::wait(Requeue::AwaitChange)
    }
}

/// The effects that apply a restricted run's NetworkPolicy before its workload may start (its
/// cold pod's creation, its claim of a warm pool's pod), with their Events: the warning of
/// `--network-policy=unenforced-warn`, then what is enforced.
pub(crate) fn egress_effects(
    policy: Box<k8s_openapi::api::networking::v1::NetworkPolicy>,
    note: String,
    unenforced: Option<String>,
) -> Vec<Effect> {
    let warning = unenforced.map(|warning| {
        Effect::Publish(PlannedEvent::warning(
            events::EGRESS_POLICY_UNENFORCED,
            warning,
            EGRESS_ACTION,
        ))
    });
    warning
        .into_iter()
        .chain([
            Effect::ApplyNetworkPolicy(policy),
            Effect::Publish(PlannedEvent::normal(
                events::EGRESS_POLICY_APPLIED,
                note,
                EGRESS_ACTION,
            )),
        ])
        .collect()
}

/// The run's egress cannot be enforced: it does not start; its status and a Warning say why,
/// once (a run that already says exactly this is left as it is, until its spec changes).
pub(super) fn egress_refused(
    run: &SandboxRun,
    refusal: Refusal,
    message: &str,
    now: Timestamp,
) -> Plan {
    if run.status.as_ref().and_then(|s| s.message.as_deref()) == Some(message) {
        return Plan::wait(Requeue::AwaitChange);
    }
    let (event_reason, reason) = match refusal {
        Refusal::InvalidSpec => (events::INVALID_SPEC, REASON_INVALID_SPEC),
        Refusal::Unenforced => (
            events::EGRESS_POLICY_UNENFORCED,
            events::EGRESS_POLICY_UNENFORCED,
        ),
    };
    Plan {
        events: vec![PlannedEvent::warning(event_reason, message, EGRESS_ACTION)],
        status: Some(pending_status(run, reason, message, now)),
        effects: Vec::new(),
        requeue: Requeue::AwaitChange,
    }
}

/// How soon a run held for its store is looked at again: its store ConfigMap and Secret are not
/// watched.
pub(crate) const STORE_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The run's store cannot be used (docs/contract.md "A store per namespace"): its pod is not
/// created (nothing it wrote could be drained), `Ready=False` with reason `StoreUnusable` and the
/// store's words, one Warning Event per distinct message, looked at again every
/// [`STORE_RECHECK`] until the store is fixed or the run is deleted.
pub(crate) fn store_unusable(run: &SandboxRun, message: &str, now: Timestamp) -> Plan {
    let requeue = Requeue::After(STORE_RECHECK);
    let words = format!("{message}; the pod is not created until the store can be used");
    if run.status.as_ref().and_then(|s| s.message.as_deref()) == Some(words.as_str()) {
        return Plan::wait(requeue);
    }
    Plan {
        events: vec![PlannedEvent::warning(
            events::STORE_UNUSABLE,
            words.clone(),
            "Start",
        )],
        status: Some(pending_status(run, events::STORE_UNUSABLE, &words, now)),
        effects: Vec::new(),
        requeue,
    }
}

/// How soon a run held for its template is looked at again: templates are not watched.
pub(crate) const TEMPLATE_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The run's template cannot make its spec (docs/contract.md "Templates"): its pod is not
/// created (the run never runs with its own spec), `Ready=False` with reason `TemplateUnusable`
/// and the words, one Warning Event per distinct message, looked at again every
/// [`TEMPLATE_RECHECK`] until the template is there or the run is changed or deleted.
pub(crate) fn template_unusable(run: &SandboxRun, message: &str, now: Timestamp) -> Plan {
    let requeue = Requeue::After(TEMPLATE_RECHECK);
    let words = format!("{message}; the pod is not created until the template can make the run");
    if run.status.as_ref().and_then(|s| s.message.as_deref()) == Some(words.as_str()) {
        return Plan::wait(requeue);
    }
    Plan {
        events: vec![PlannedEvent::warning(
            events::TEMPLATE_UNUSABLE,
            words.clone(),
            "Start",
        )],
        status: Some(pending_status(run, events::TEMPLATE_UNUSABLE, &words, now)),
        effects: Vec::new(),
        requeue,
    }
}

/// `plan` for a run whose template was resolved in this reconcile (`run.status.template`, not
/// yet stored): the status that records it is written before the pod is created, so the run
/// keeps that template whatever happens to it since (docs/contract.md "Templates"). A plan that
/// writes a status already carries it (every status is built from the run's).
pub(crate) fn recording_template(mut plan: Plan, run: &SandboxRun) -> Plan {
    let creates = plan
        .effects
        .iter()
        .any(|e| matches!(e, Effect::CreatePod(_)));
    if creates && plan.status.is_none() {
        plan.status = Some(run.status.clone().unwrap_or_default());
    }
    plan
}

/// The pre-flight found the run's image missing from its registry (docs/contract.md ADR-006 §5):
/// no pod is created; the run fails at once with reason `ImageUnresolvable`, a Warning Event
/// and the final status both carrying the registry's words and the hint.
pub(crate) fn image_unresolvable(
    run: &SandboxRun,
    message: &str,
    hint: &str,
    now: Timestamp,
) -> Plan {
    let words = format!("{message}; the pod was not created (hint: {hint})");
    Plan {
        events: vec![PlannedEvent::warning(
            events::IMAGE_UNRESOLVABLE,
            words.clone(),
            "Preflight",
        )],
        status: Some(image_unresolvable_status(run, &words, now)),
        effects: vec![Effect::ForgetCreateAttempts],
        requeue: Requeue::AwaitChange,
    }
}

/// The pre-flight could not tell whether the run's image resolves: the pod is created anyway
/// (the kubelet may still pull it), and this Warning says the image was not verified.
pub(crate) fn image_unverified(message: &str) -> PlannedEvent {
    PlannedEvent::warning(events::IMAGE_UNVERIFIED, message, "Preflight")
}

/// The apiserver refused the pod (quota, Pod Security, a webhook, RBAC): say so where the user
/// looks, and try again after a back-off rather than every 10 s.
pub(crate) fn pod_refused(run: &SandboxRun, message: &str, now: Timestamp) -> Plan {
    let status = refusals::refused_status(run, message, now);
    let note = status.message.clone().unwrap_or_default();
    let since = refusals::refused_since_in(&status, run.metadata.generation).unwrap_or(now);
    let retry = refusals::retry_delay(since, now);
    Plan {
        events: vec![PlannedEvent::warning(
            events::POD_CREATE_FAILED,
            note,
            "CreatePod",
        )],
        status: Some(status),
        effects: vec![Effect::RecordCreateAttempt(now)],
        requeue: Requeue::After(retry + LOOK_AGAIN_MARGIN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ReadBackPhase};
    use crate::controller::conditions;

    use crate::controller::run::decide::Step;

    use crate::controller::pod_view::PodProblem;
    use crate::controller::pod_view::{PodView, WorkloadState};
    use crate::controller::run::plan::testing::*;
    use crate::controller::run::plan::*;
    use crate::controller::testkit::fixtures::*;

    use crate::pod::PodSettings;

    #[test]
    fn a_run_whose_store_cannot_be_used_waits_ready_false_without_a_pod_and_says_it_once() {
        let mut r = with_generation(run_with(&[("/out", true)]));
        let why = "the store ConfigMap team/sandboxrun-store: its credentials: the store Secret team/creds does not exist";
        let plan = store_unusable(&r, why, now());
        assert!(plan.effects.is_empty(), "no pod, no policy");
        assert_eq!(plan.requeue, Requeue::After(STORE_RECHECK));
        assert_eq!(plan.events.len(), 1);
        assert!(plan.events[0].warning);
        assert_eq!(plan.events[0].reason, "StoreUnusable");
        assert!(plan.events[0].note.contains("team/creds does not exist"));
        let status = plan.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::READY)
            .expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "StoreUnusable")
        );
        assert!(
            ready.message.contains("team/sandboxrun-store"),
            "{}",
            ready.message
        );
        // Said once: the same words again are only a later look.
        r.status = Some(status);
        let again = store_unusable(&r, why, now());
        assert!(again.events.is_empty() && again.status.is_none());
        assert_eq!(again.requeue, Requeue::After(STORE_RECHECK));
    }

    /// Issue #38: without the webhook, `/../usr/local/bin` got a pod whose holder mounted over
    /// its own binary, and a run-policy violation got a pod. The controller judges the run by
    /// the webhook's rules before it builds a pod: held, the rule and its hint said, no effect.
    #[test]
    fn a_run_the_rules_refuse_gets_no_pod_and_is_held_with_the_rule_and_its_hint() {
        let settings = PodSettings::default();
        let traversal = with_generation(run_with(&[("/../usr/local/bin", true)]));
        let mut policy = with_generation(run_with(&[("/out", true)]));
        policy.spec.runtime_class_name = Some("kata".into());
        let rules = crate::policy::RuleSettings {
            policy: crate::policy::run_policy::RunPolicy {
                runtime_classes: Some(vec!["gvisor".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        for (r, rule) in [(&traversal, "read-back-path"), (&policy, "run-policy")] {
            let mut at = inputs(r, None, &settings);
            at.rules = &rules;
            let StepPlan::Carry(plan) = create_pod(r, &at) else {
                panic!("{rule}: a pod was planned");
            };
            assert!(plan.effects.is_empty(), "{rule}: no pod, no policy");
            assert_eq!(plan.requeue, Requeue::AwaitChange);
            let status = plan.status.clone().unwrap_or_default();
            assert_eq!(
                cond_of(&status, conditions::READY),
                pair("False", "InvalidSpec")
            );
            let message = status.message.unwrap_or_default();
            assert!(
                message.contains(&format!("rule {rule} at spec.")),
                "{message}"
            );
            assert!(message.contains("hint: "), "{message}");
            assert_eq!(plan.events.len(), 1);
            assert_eq!(plan.events[0].reason, "InvalidSpec");
        }
        // A clean run with the same rules gets its pod.
        let clean = with_generation(run_with(&[("/out", true)]));
        let mut at = inputs(&clean, None, &settings);
        at.rules = &rules;
        assert!(matches!(create_pod(&clean, &at), StepPlan::CreatePod(_)));
    }

    #[test]
    fn a_run_whose_template_cannot_make_it_waits_ready_false_without_a_pod_and_says_it_once() {
        let mut r = with_generation(run_with(&[("/out", true)]));
        let why = "the SandboxRunTemplate team/locked does not exist";
        let plan = template_unusable(&r, why, now());
        assert!(plan.effects.is_empty(), "no pod, no policy");
        assert_eq!(plan.requeue, Requeue::After(TEMPLATE_RECHECK));
        assert_eq!(plan.events.len(), 1);
        assert!(plan.events[0].warning);
        assert_eq!(plan.events[0].reason, "TemplateUnusable");
        let status = plan.status.clone().unwrap_or_default();
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", "TemplateUnusable")
        );
        assert_eq!(status.phase, Some(Phase::Pending));
        assert!(status.message.as_deref().unwrap_or_default().contains(why));
        r.status = Some(status);
        let again = template_unusable(&r, why, now());
        assert!(again.events.is_empty() && again.status.is_none());
    }

    /// Issue #51 item 8: the namespace policies were the webhook's alone; with no webhook a run
    /// of an image its namespace's policy refuses got a pod (this fails on the old `creation`,
    /// which planned the pod). Judged on the run as made from its template, in the namespaces
    /// the policy selects and nowhere else.
    #[test]
    fn a_run_its_namespace_policy_refuses_gets_no_pod_and_is_held_naming_the_policy() {
        use crate::egress::verdict::EgressVerdict;
        let mut r = with_generation(run_with(&[("/out", true)]));
        r.spec.image = Some("evil.example/miner:1".into());
        let pod = || crate::pod::build_pod(&r, &PodSettings::default()).unwrap();
        let policies = crate::policy::namespace_policy::load(
            "- name: locked-tier\n  namespaceSelector: {matchLabels: {tier: locked}}\n  images: [\"registry.corp.example/**\"]\n",
        )
        .unwrap();
        let in_tier = |tier: &str| CreationFacts {
            namespace_labels: Some([("tier".to_string(), tier.to_string())].into()),
            ..CreationFacts::default()
        };
        let held = creation(
            &r,
            pod(),
            in_tier("locked"),
            (EgressVerdict::Open, &policies),
            now(),
        );
        assert!(held.effects.is_empty(), "no pod, no policy: {held:?}");
        assert_eq!(held.requeue, Requeue::AwaitChange);
        let status = held.status.clone().unwrap_or_default();
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", "InvalidSpec")
        );
        let message = status.message.clone().unwrap_or_default();
        assert!(
            message.contains("rule run-policy at spec.image")
                && message.contains("locked-tier")
                && message.contains("hint: "),
            "{message}"
        );
        assert_eq!(held.events.len(), 1);
        // Said once: a later look with the same words writes nothing new.
        let mut told = r.clone();
        told.status = Some(status);
        let again = creation(
            &told,
            pod(),
            in_tier("locked"),
            (EgressVerdict::Open, &policies),
            now(),
        );
        assert!(again.events.is_empty(), "{again:?}");
        // A namespace the policy does not select creates the pod.
        let created = creation(
            &r,
            pod(),
            in_tier("open"),
            (EgressVerdict::Open, &policies),
            now(),
        );
        assert!(
            matches!(created.effects.last(), Some(Effect::CreatePod(_))),
            "{created:?}"
        );
    }

    #[test]
    fn the_pod_is_created_in_the_shape_the_prepared_facts_give_it_or_not_at_all() {
        use crate::egress::verdict::EgressVerdict;
        let r = with_generation(run_with(&[("/out", true)]));
        let pod = || crate::pod::build_pod(&r, &PodSettings::default()).unwrap();
        let policies = crate::policy::namespace_policy::load(
            "- name: free-tier\n  namespaceSelector: {matchLabels: {tier: free}}\n  defaultRuntimeClass: sandboxed\n",
        )
        .unwrap();
        let facts = CreationFacts {
            namespace_labels: Some([("tier".to_string(), "free".to_string())].into()),
            flavors: vec![serde_json::json!({"spec": {"nodeLabels": {"pool": "gpu"}}})],
            ..CreationFacts::default()
        };
        let plan = creation(&r, pod(), facts, (EgressVerdict::Open, &policies), now());
        let Some(Effect::CreatePod(created)) = plan.effects.last() else {
            panic!("{plan:?}");
        };
        let spec = created.spec.as_ref().unwrap();
        assert_eq!(spec.runtime_class_name.as_deref(), Some("sandboxed"));
        assert_eq!(
            spec.node_selector
                .as_ref()
                .and_then(|s| s.get("pool"))
                .map(String::as_str),
            Some("gpu")
        );
        // A store that cannot be used: no pod, the run held saying why.
        let facts = CreationFacts::store_unusable("no Secret tenant-key".into());
        let held = creation(&r, pod(), facts, (EgressVerdict::Open, &policies), now());
        assert!(
            !held
                .effects
                .iter()
                .any(|e| matches!(e, Effect::CreatePod(_))),
            "{held:?}"
        );
        assert_eq!(held.events[0].reason, events::STORE_UNUSABLE);
    }

    #[test]
    fn the_template_a_run_is_made_from_is_recorded_before_its_pod_is_created() {
        let mut r = with_generation(run_with(&[("/out", true)]));
        r.status.get_or_insert_with(Default::default).template =
            Some(crate::api::AppliedTemplate {
                name: "locked".into(),
                generation: Some(4),
                ..Default::default()
            });
        let pod = crate::pod::build_pod(&r, &PodSettings::default()).unwrap();
        let plan = create(
            &r,
            pod,
            Preflight::Proceed,
            crate::egress::verdict::EgressVerdict::Open,
            now(),
        );
        assert!(plan.status.is_none(), "a fresh run's pod is quiet");
        let plan = recording_template(plan, &r);
        // The plan's status is written before its effects, the pod's creation among them.
        let recorded = plan.status.and_then(|s| s.template).expect("recorded");
        assert_eq!(
            (recorded.name.as_str(), recorded.generation),
            ("locked", Some(4))
        );
        assert!(plan
            .effects
            .iter()
            .any(|e| matches!(e, Effect::CreatePod(_))));
    }

    #[test]
    fn an_unresolvable_image_fails_the_run_at_once_and_no_pod_is_ever_created() {
        use crate::controller::run::decide::decide;
        let r = with_generation(run_with(&[("/out", true), ("/logs", false)]));
        let pod_settings = PodSettings::default();
        // Before the pre-flight the step is to create the pod…
        assert!(step_line(plan_step(
            decide(&r, None, now(), &settings()),
            &inputs(&r, None, &pod_settings)
        ))
        .starts_with("create "));
        let plan = image_unresolvable(
            &r,
            "image `localhost:5000/app:nope` does not resolve: localhost:5000 answered 404",
            "push the image first",
            now(),
        );
        assert_eq!(
            line(&plan),
            "[!ImageUnresolvable/Preflight] | Failed | [ForgetCreateAttempts] | await"
        );
        let note = &plan.events[0].note;
        assert!(
            note.contains("answered 404") && note.contains("hint: push the image first"),
            "{note}"
        );
        let status = plan.status.clone().unwrap_or_default();
        assert_one_ending(&status);
        assert_eq!(
            cond_of(&status, conditions::FAILED),
            pair("True", "ImageUnresolvable")
        );
        assert_eq!(
            cond_of(&status, conditions::READY),
            pair("False", "ImageUnresolvable")
        );
        assert_eq!(status.message.as_deref(), Some(note.as_str()));
        // The workload never ran: every path is Empty, not a drain failure; Drained=True.
        assert_eq!(
            status
                .read_back
                .iter()
                .map(|e| (e.path.as_str(), e.phase))
                .collect::<Vec<_>>(),
            [
                ("/out", ReadBackPhase::Empty),
                ("/logs", ReadBackPhase::Empty)
            ]
        );
        assert_eq!(
            cond_of(&status, conditions::DRAINED),
            pair("True", "Drained")
        );
        assert_eq!(status.pod_name, None);
        assert!(status.completion_time.is_some());
        // …and after it, the run is over: nothing creates a pod again, deletion lets it go.
        let mut failed = r.clone();
        failed.status = Some(status);
        let next = decide(&failed, None, later(60), &settings());
        assert_eq!(next, Step::DeleteFinishedPod);
        assert_eq!(
            line(&delete_finished_pod(&failed, None, later(60))),
            "[] | - | [] | await"
        );
        let gone = deleting(failed);
        assert_eq!(
            decide(&gone, None, later(60), &settings()),
            Step::ReleaseFinalizer
        );
    }

    #[test]
    fn an_unverified_image_is_a_warning_about_the_run() {
        let e = image_unverified("cannot prove image `x` resolvable: the registry timed out");
        assert!(e.warning && !e.about_pod);
        assert_eq!((e.reason, e.action), ("ImageUnverified", "Preflight"));
        assert!(e.note.contains("timed out"));
    }

    #[test]
    fn an_invalid_spec_is_told_once_and_a_refused_pod_waits_out_its_back_off() {
        let settings = PodSettings::default();
        let mut r = run_with(&[("/out", false)]);
        r.spec.user = Some("root".into());
        let StepPlan::Carry(first) = plan_step(Step::CreatePod, &inputs(&r, None, &settings))
        else {
            panic!("an invalid spec is recorded");
        };
        r.status = first.status.clone();
        let again = step_line(plan_step(Step::CreatePod, &inputs(&r, None, &settings)));
        assert_eq!(again, "[] | Pending | [] | await", "told once");

        let r = run_with(&[("/out", false)]);
        let refused = pod_refused(&r, "exceeded quota", now());
        assert_eq!(
            line(&refused),
            "[!PodCreateFailed/CreatePod] | Pending | [RecordCreateAttempt] | 10.2s"
        );
        let mut r2 = r.clone();
        r2.status = refused.status;
        let mut waiting = inputs(&r2, None, &settings);
        waiting.last_create_attempt = Some(now());
        waiting.now = later(4);
        assert_eq!(
            step_line(plan_step(Step::CreatePod, &waiting)),
            "[] | - | [] | 6.2s"
        );
    }

    #[test]
    fn a_created_pod_is_announced_and_one_that_existed_is_not() {
        // A run already reported (here: its pod was refused before) is told at once.
        let r = with_phase(run_with(&[("/out", false)]), Phase::Pending);
        let created = pod_created(&r, "demo-sbr", true, SETTLE, now());
        assert_eq!(
            line(&created),
            "[PodCreated/CreatePod@pod] | Pending | [ForgetCreateAttempts] | await"
        );
        let status = created.status.unwrap_or_default();
        assert_eq!(status.pod_name.as_deref(), Some("demo-sbr"));
        assert_eq!(status.read_back.len(), 1, "every path is Pending");
        assert_eq!(
            line(&pod_created(&r, "demo-sbr", false, SETTLE, now())),
            "[] | Pending | [] | await"
        );
    }

    #[test]
    fn a_fresh_runs_pod_is_reported_only_if_it_has_not_run_within_the_settle_time() {
        let fresh = run_with(&[("/out", false)]);
        // Created: nothing written, remembered, looked at again when SETTLE has passed.
        assert_eq!(
            line(&pod_created(&fresh, "demo-sbr", true, SETTLE, now())),
            "[] | - | [ForgetCreateAttempts RememberUnreportedPod] | 2.2s"
        );
        let starting = |since: i64| PodView {
            holder_running: false,
            workload: WorkloadState::NotStarted,
            started_at: None,
            pending_since: Some(later(-since)),
            ..running()
        };
        // Just created and starting: still quiet, looked at again at the end of SETTLE.
        let quiet = track_pod(&fresh, "demo-sbr", Some(&starting(0)), None, now(), SETTLE);
        assert_eq!(line(&quiet), "[] | - | [] | 2.2s");
        // Running within SETTLE: one write, Running, and no Event (nothing to notice).
        let ran = track_pod(&fresh, "demo-sbr", Some(&running()), None, now(), SETTLE);
        assert_eq!(line(&ran), "[] | Running | [] | await");
        assert_eq!(
            ran.status.and_then(|s| s.pod_name).as_deref(),
            Some("demo-sbr")
        );
        // Still starting after SETTLE: reported Pending, in the status only (its pod's name).
        let slow = track_pod(&fresh, "demo-sbr", Some(&starting(3)), None, now(), SETTLE);
        assert_eq!(line(&slow), "[] | Pending | [] | 5.2s");
        assert_eq!(
            slow.status.and_then(|s| s.pod_name).as_deref(),
            Some("demo-sbr")
        );
        // ...and its running after that Pending too: nothing went wrong to be told.
        let pending = with_phase(fresh.clone(), Phase::Pending);
        let track = |run: &SandboxRun, view: &PodView| {
            line(&track_pod(run, "demo-sbr", Some(view), None, now(), SETTLE))
        };
        assert_eq!(track(&pending, &running()), "[] | Running | [] | await");
        // A problem is reported at once, however young the pod, with a Warning Event.
        let stuck = PodView {
            problem: Some(PodProblem::Stuck {
                reason: "FailedMount",
                message: "configmap \"cfg\" not found".into(),
            }),
            ..starting(0)
        };
        assert_eq!(
            track(&fresh, &stuck),
            "[!PodStuck/FailedMount@pod] | Pending | [] | 5.2s"
        );
        // Once a problem was told, the pod's running is told too: the problem is over.
        let told = track_pod(&fresh, "demo-sbr", Some(&stuck), None, now(), SETTLE);
        let mut after_problem = fresh.clone();
        after_problem.status = told.status;
        assert_eq!(
            track(&after_problem, &running()),
            "[Running/Track@pod] | Running | [] | await"
        );
    }
}
