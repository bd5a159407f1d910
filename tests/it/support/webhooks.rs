//! Validating webhook configurations that the tests register by URL on loopback.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;

/// CREATE and UPDATE of SandboxRuns, as the operator's own webhook is registered.
pub fn sandboxrun_rule() -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec!["sandbox.iterion.io".into()]),
        api_versions: Some(vec!["v1alpha1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec!["sandboxruns".into()]),
        scope: Some("Namespaced".into()),
    }
}

/// The configuration `name` with one webhook `webhook` that sends the requests `rule` matches,
/// from the test namespace `ns` only (its `sandboxrun-test` label), to `url`; it fails closed
/// after 5 s. `ca_bundle`: the CA to trust, or None when the operator publishes it itself.
pub fn loopback_webhook(
    name: &str,
    webhook: &str,
    ns: &str,
    url: String,
    ca_bundle: Option<Vec<u8>>,
    rule: RuleWithOperations,
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: webhook.into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(5),
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("sandboxrun-test".to_string(), ns.to_string())].into()),
                ..Default::default()
            }),
            client_config: WebhookClientConfig {
                url: Some(url),
                ca_bundle: ca_bundle.map(ByteString),
                service: None,
            },
            rules: Some(vec![rule]),
            ..Default::default()
        }]),
    }
}

/// The mutating half of the operator's webhook (`/mutate-sandboxrun`, the admission stamps) as
/// [`loopback_webhook`] registers the validating one: `name`, from the test namespace `ns` only,
/// to `url`, trusting `ca_bundle`, failing closed after 5 s.
pub fn loopback_mutating_webhook(
    name: &str,
    ns: &str,
    url: String,
    ca_bundle: Vec<u8>,
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "stamp.sandbox.iterion.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            reinvocation_policy: Some("Never".into()),
            timeout_seconds: Some(5),
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("sandboxrun-test".to_string(), ns.to_string())].into()),
                ..Default::default()
            }),
            client_config: WebhookClientConfig {
                url: Some(url),
                ca_bundle: Some(ByteString(ca_bundle)),
                service: None,
            },
            rules: Some(vec![sandboxrun_rule()]),
            ..Default::default()
        }]),
    }
}
