//! The operator's live settings, published for `doctor --context` (docs/contract.md ADR-006 §3):
//! the operator writes them into a ConfigMap it owns (`run --settings-configmap`, in its own
//! namespace, labelled [`SETTINGS_LABEL`]) when it starts and again every
//! [`HEARTBEAT_INTERVAL`] while it is Ready, so `doctor` judges manifests with the caps, drain
//! timeout maximum and network-policy mode the cluster really runs with, and can tell a live
//! operator from a stale record ([`Freshness`]). Pure: the ConfigMap's data, both ways.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ValueEnum;
use jiff::Timestamp;
use thiserror::Error;

use super::namespace_policy::{compile, NamespacePolicy};
use super::rules::RuleSettings;
use super::run_policy::{parse_list, RunPolicy};
use crate::caps::CapSettings;
use crate::drain::wire::Wire;
use crate::egress::PolicyEnforcement;
use crate::store::tenant::TenantStorePolicy;

/// The label (and its value, the format's version) that marks the settings ConfigMap: `doctor`
/// finds it by this label in the operator's namespace, whatever the release called it.
pub(crate) const SETTINGS_LABEL: &str = "sandbox.iterion.io/operator-settings";
/// The format version the label carries.
pub(crate) const SETTINGS_FORMAT: &str = "v1";
/// The ConfigMap's name when `run --settings-configmap` is not given.
pub(crate) const DEFAULT_SETTINGS_CONFIGMAP: &str = "sandboxrun-operator-settings";
/// How often a Ready operator rewrites its settings (the heartbeat).
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);
/// A heartbeat older than this means the operator is not running (or not Ready): three missed
/// beats, so one slow write is not an outage.
pub(crate) const HEARTBEAT_STALE: Duration = Duration::from_secs(180);

/// What a running operator publishes about itself.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PublishedSettings {
    /// What admission judges with: caps, the drain timeout maximum, the network-policy mode.
    pub(crate) rules: RuleSettings,
    /// `run --drain-timeout`: the drain timeout of a run that sets none.
    pub(crate) default_drain_timeout: Duration,
    /// `run --drain-wire`.
    pub(crate) drain_wire: Wire,
    /// `run --image-pull-timeout`.
    pub(crate) image_pull_timeout: Duration,
    /// The webhook resolves images (`run --check-images`).
    pub(crate) check_images: bool,
    /// The controller resolves images before creating pods (`run --preflight-images`).
    pub(crate) preflight_images: bool,
    /// The operator serves the webhook (`run --webhook-addr` not empty).
    pub(crate) webhook: bool,
    /// The pod (`POD_NAME`) that wrote this.
    pub(crate) pod: String,
    /// The operator's version.
    pub(crate) version: String,
    /// When it was written (the heartbeat); None in a record that has none.
    pub(crate) heartbeat: Option<Timestamp>,
    /// The namespaces its controller watches (`run --namespaces`); empty: every namespace.
    pub(crate) watched_namespaces: Vec<String>,
    /// Its tenant store rules (`run --tenant-store-endpoints`, `--tenant-store-secret-names`);
    /// None in a record from an operator that did not publish them.
    pub(crate) tenant_stores: Option<TenantStorePolicy>,
}

/// Why a published record cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum PublishedError {
    /// A key the format requires is absent.
    #[error("key {0} is missing")]
    Missing(&'static str),
    /// A key's value does not parse.
    #[error("key {key} = {value:?} does not parse")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
    },
}

mod keys {
    pub(crate) const MAX_CAP: &str = "maxCapBytes";
    pub(crate) const DEFAULT_CAP: &str = "defaultCapBytes";
    pub(crate) const MAX_DRAIN_TIMEOUT: &str = "maxDrainTimeoutSeconds";
    pub(crate) const DRAIN_TIMEOUT: &str = "drainTimeoutSeconds";
    pub(crate) const NETWORK_POLICY: &str = "networkPolicy";
    pub(crate) const DRAIN_WIRE: &str = "drainWire";
    pub(crate) const IMAGE_PULL_TIMEOUT: &str = "imagePullTimeoutSeconds";
    pub(crate) const CHECK_IMAGES: &str = "checkImages";
    pub(crate) const PREFLIGHT_IMAGES: &str = "preflightImages";
    pub(crate) const WEBHOOK: &str = "webhook";
    pub(crate) const POD: &str = "pod";
    pub(crate) const VERSION: &str = "operatorVersion";
    pub(crate) const HEARTBEAT: &str = "heartbeat";
    pub(crate) const RUNTIME_CLASSES: &str = "allowedRuntimeClasses";
    pub(crate) const PRIORITY_CLASSES: &str = "allowedPriorityClasses";
    pub(crate) const TOLERATION_KEYS: &str = "allowedTolerationKeys";
    pub(crate) const WATCHED_NAMESPACES: &str = "watchNamespaces";
    pub(crate) const NAMESPACE_POLICIES: &str = "namespacePolicies";
    pub(crate) const TENANT_STORE_ENDPOINTS: &str = "tenantStoreEndpoints";
    pub(crate) const TENANT_STORE_SECRET_NAMES: &str = "tenantStoreSecretNames";
}

impl PublishedSettings {
    /// The ConfigMap's `data`. Numbers are plain integers (bytes, seconds): no unit grammar for
    /// a reader to get wrong.
    pub(crate) fn to_data(&self) -> BTreeMap<String, String> {
        let mut d = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            d.insert(k.to_string(), v);
        };
        put(keys::MAX_CAP, self.rules.caps.max_bytes.to_string());
        put(keys::DEFAULT_CAP, self.rules.caps.default_bytes.to_string());
        if let Some(max) = self.rules.max_drain_timeout {
            put(keys::MAX_DRAIN_TIMEOUT, max.as_secs().to_string());
        }
        put(
            keys::DRAIN_TIMEOUT,
            self.default_drain_timeout.as_secs().to_string(),
        );
        put(keys::NETWORK_POLICY, self.rules.network_policy.to_string());
        put(keys::DRAIN_WIRE, self.drain_wire.as_str().to_string());
        put(
            keys::IMAGE_PULL_TIMEOUT,
            self.image_pull_timeout.as_secs().to_string(),
        );
        put(keys::CHECK_IMAGES, self.check_images.to_string());
        put(keys::PREFLIGHT_IMAGES, self.preflight_images.to_string());
        put(keys::WEBHOOK, self.webhook.to_string());
        put(keys::POD, self.pod.clone());
        put(keys::VERSION, self.version.clone());
        if let Some(t) = self.heartbeat {
            put(keys::HEARTBEAT, t.to_string());
        }
        if !self.watched_namespaces.is_empty() {
            put(keys::WATCHED_NAMESPACES, self.watched_namespaces.join(","));
        }
        // The run policy: a key per restricted field (comma-separated; "" allows none); absent
        // when the field is unrestricted, as in a record from an operator without a policy.
        let policy = &self.rules.policy;
        for (key, list) in [
            (keys::RUNTIME_CLASSES, &policy.runtime_classes),
            (keys::PRIORITY_CLASSES, &policy.priority_classes),
            (keys::TOLERATION_KEYS, &policy.toleration_keys),
        ] {
            if let Some(list) = list {
                put(key, list.join(","));
            }
        }
        // The namespace policies as the file wrote them (JSON), absent when there are none.
        let namespace_policies: Vec<&NamespacePolicy> = self
            .rules
            .namespace_policies
            .iter()
            .map(|c| &c.policy)
            .collect();
        if !namespace_policies.is_empty() {
            put(
                keys::NAMESPACE_POLICIES,
                serde_json::to_string(&namespace_policies).unwrap_or_default(),
            );
        }
        // Tenant stores: the endpoints ("" when off), and the Secret names when narrowed.
        if let Some(t) = &self.tenant_stores {
            put(keys::TENANT_STORE_ENDPOINTS, t.patterns().join(","));
            if !t.secret_names().is_empty() {
                put(keys::TENANT_STORE_SECRET_NAMES, t.secret_names().join(","));
            }
        }
        d
    }

    /// Reads a ConfigMap's `data` back. The rule settings are required; the rest is reported
    /// when present and defaulted when not (a newer operator may add keys, an older one lack some).
    pub(crate) fn from_data(data: &BTreeMap<String, String>) -> Result<Self, PublishedError> {
        let optional_secs = |k: &'static str| optional_secs(data, k);
        let flag = |k: &'static str| -> Result<bool, PublishedError> {
            data.get(k).map_or(Ok(false), |v| parse(k, v))
        };
        let policy = required(data, keys::NETWORK_POLICY)?;
        let network_policy = PolicyEnforcement::from_str(policy, false)
            .map_err(|_| invalid(keys::NETWORK_POLICY, policy))?;
        let drain_wire = match data.get(keys::DRAIN_WIRE) {
            Some(w) => Wire::from_str(w, false).map_err(|_| invalid(keys::DRAIN_WIRE, w))?,
            None => Wire::default(),
        };
        let heartbeat = match data.get(keys::HEARTBEAT) {
            Some(t) => Some(parse::<Timestamp>(keys::HEARTBEAT, t)?),
            None => None,
        };
        let namespace_policies = match data.get(keys::NAMESPACE_POLICIES) {
            Some(text) => serde_json::from_str::<Vec<NamespacePolicy>>(text)
                .ok()
                .and_then(|p| compile(p).ok())
                .ok_or_else(|| invalid(keys::NAMESPACE_POLICIES, text))?,
            None => Vec::new(),
        };
        let tenant_stores = tenant_stores_of(data)?;
        Ok(PublishedSettings {
            rules: rule_settings_of(data, network_policy, namespace_policies)?,
            default_drain_timeout: optional_secs(keys::DRAIN_TIMEOUT)?.unwrap_or_default(),
            drain_wire,
            image_pull_timeout: optional_secs(keys::IMAGE_PULL_TIMEOUT)?.unwrap_or_default(),
            check_images: flag(keys::CHECK_IMAGES)?,
            preflight_images: flag(keys::PREFLIGHT_IMAGES)?,
            webhook: flag(keys::WEBHOOK)?,
            pod: data.get(keys::POD).cloned().unwrap_or_default(),
            version: data.get(keys::VERSION).cloned().unwrap_or_default(),
            heartbeat,
            watched_namespaces: parse_list(data.get(keys::WATCHED_NAMESPACES).map(String::as_str))
                .unwrap_or_default(),
            tenant_stores,
        })
    }

    /// One line for a report: what the operator runs with.
    pub(crate) fn describe(&self) -> String {
        let max_drain = self
            .rules
            .max_drain_timeout
            .map_or_else(|| "none".to_string(), |d| format!("{}s", d.as_secs()));
        format!(
            "max-cap {} B, default-cap {} B, max-drain-timeout {max_drain}, network-policy {}, \
             drain-wire {}, check-images {}, preflight-images {}, run policy: {}; namespace \
             policies: {}; tenant stores: {}",
            self.rules.caps.max_bytes,
            self.rules.caps.default_bytes,
            self.rules.network_policy,
            self.drain_wire.as_str(),
            self.check_images,
            self.preflight_images,
            self.rules.policy.describe(),
            describe_policies(&self.rules.namespace_policies),
            describe_tenant_stores(self.tenant_stores.as_ref())
        )
    }
}

/// The value of the required key `k` (`from_data`).
fn required<'a>(
    d: &'a BTreeMap<String, String>,
    k: &'static str,
) -> Result<&'a str, PublishedError> {
    d.get(k)
        .map(String::as_str)
        .ok_or(PublishedError::Missing(k))
}

/// `v`, the value of key `k`, parsed.
fn parse<T: std::str::FromStr>(k: &'static str, v: &str) -> Result<T, PublishedError> {
    v.trim().parse().map_err(|_| invalid(k, v))
}

/// Key `k` holds the value `v`, which does not parse.
fn invalid(k: &'static str, v: &str) -> PublishedError {
    PublishedError::Invalid {
        key: k,
        value: v.to_string(),
    }
}

/// The optional key `k`, a number of seconds.
fn optional_secs(
    d: &BTreeMap<String, String>,
    k: &'static str,
) -> Result<Option<Duration>, PublishedError> {
    d.get(k)
        .map(|v| parse::<u64>(k, v).map(Duration::from_secs))
        .transpose()
}

/// The rule settings `from_data` reads back: the caps (required), the largest drain timeout and
/// the run policy's lists, with the network policy and namespace policies already read.
fn rule_settings_of(
    data: &BTreeMap<String, String>,
    network_policy: PolicyEnforcement,
    namespace_policies: Vec<super::namespace_policy::Compiled>,
) -> Result<RuleSettings, PublishedError> {
    let number = |k: &'static str| -> Result<u64, PublishedError> { parse(k, required(data, k)?) };
    let list = |k: &'static str| parse_list(data.get(k).map(String::as_str));
    Ok(RuleSettings {
        caps: CapSettings {
            default_bytes: number(keys::DEFAULT_CAP)?,
            max_bytes: number(keys::MAX_CAP)?,
        },
        max_drain_timeout: optional_secs(data, keys::MAX_DRAIN_TIMEOUT)?,
        network_policy,
        policy: RunPolicy {
            runtime_classes: list(keys::RUNTIME_CLASSES),
            priority_classes: list(keys::PRIORITY_CLASSES),
            toleration_keys: list(keys::TOLERATION_KEYS),
        },
        namespace_policies,
    })
}

/// The tenant-store rules a record carries (None: an operator that published none).
fn tenant_stores_of(
    data: &BTreeMap<String, String>,
) -> Result<Option<TenantStorePolicy>, PublishedError> {
    let Some(raw) = data.get(keys::TENANT_STORE_ENDPOINTS) else {
        return Ok(None);
    };
    let invalid = |key: &'static str, value: &str| PublishedError::Invalid {
        key,
        value: value.to_string(),
    };
    let list = |v: &str| v.split(',').map(str::to_string).collect::<Vec<_>>();
    let names = data.get(keys::TENANT_STORE_SECRET_NAMES);
    TenantStorePolicy::parse(&list(raw))
        .map_err(|_| invalid(keys::TENANT_STORE_ENDPOINTS, raw))?
        .with_secret_names(&names.map(|n| list(n)).unwrap_or_default())
        .map_err(|_| invalid(keys::TENANT_STORE_SECRET_NAMES, names.map_or("", |n| n)))
        .map(Some)
}

/// The tenant-store rules in words: `off`, `not published`, or the endpoints and Secret names.
fn describe_tenant_stores(policy: Option<&TenantStorePolicy>) -> String {
    match policy {
        None => "not published".to_string(),
        Some(p) if !p.enabled() => "off".to_string(),
        Some(p) if p.secret_names().is_empty() => p.patterns().join(","),
        Some(p) => format!(
            "{} (store Secrets: {})",
            p.patterns().join(","),
            p.secret_names().join(",")
        ),
    }
}

/// The namespace policies' names, or `none`.
fn describe_policies(policies: &[crate::policy::namespace_policy::Compiled]) -> String {
    if policies.is_empty() {
        return "none".to_string();
    }
    policies
        .iter()
        .map(|c| c.policy.name.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a published record shows a live operator at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Written within [`HEARTBEAT_STALE`]: the operator is running and Ready.
    Live,
    /// Older: the operator stopped, or is not Ready (it only beats while Ready).
    Stale(Duration),
    /// No heartbeat in the record.
    Unknown,
}

/// Judges the record's heartbeat at `now` (a clock skew that puts it in the future counts as live).
pub(crate) fn freshness(settings: &PublishedSettings, now: Timestamp) -> Freshness {
    let Some(beat) = settings.heartbeat else {
        return Freshness::Unknown;
    };
    let age = Duration::try_from(beat.duration_until(now)).unwrap_or(Duration::ZERO);
    if age <= HEARTBEAT_STALE {
        Freshness::Live
    } else {
        Freshness::Stale(age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PublishedSettings {
        PublishedSettings {
            rules: RuleSettings {
                caps: CapSettings {
                    default_bytes: 1 << 20,
                    max_bytes: 64 << 20,
                },
                max_drain_timeout: Some(Duration::from_secs(600)),
                network_policy: PolicyEnforcement::UnenforcedRefuse,
                policy: RunPolicy {
                    runtime_classes: Some(vec!["gvisor".into(), "kata".into()]),
                    priority_classes: Some(Vec::new()),
                    toleration_keys: None,
                },
                namespace_policies: crate::policy::namespace_policy::load(
                    "- name: free-tier\n  namespaceSelector: {matchLabels: {tier: free}}\n  \
                     images: [\"registry.corp.example/**\"]\n  maxSizeLimit: 1Gi\n  secrets: false\n",
                )
                .unwrap(),
            },
            default_drain_timeout: Duration::from_secs(120),
            drain_wire: Wire::Zstd,
            image_pull_timeout: Duration::from_secs(90),
            check_images: true,
            preflight_images: false,
            webhook: true,
            pod: "sandboxrun-operator-5d9c-x".into(),
            version: "0.1.0".into(),
            heartbeat: Some(Timestamp::from_second(1_800_000_000).unwrap_or_default()),
            watched_namespaces: vec!["team-a".into(), "team-b".into()],
            tenant_stores: Some(
                TenantStorePolicy::parse(&["http://minio.storage:9000".into(), "*.amazonaws.com".into()])
                    .and_then(|p| p.with_secret_names(&["store-creds".into()]))
                    .unwrap(),
            ),
        }
    }

    #[test]
    fn the_record_reads_back_what_was_written() {
        let s = sample();
        let data = s.to_data();
        assert_eq!(
            data.get("maxCapBytes").map(String::as_str),
            Some("67108864")
        );
        assert_eq!(
            data.get("networkPolicy").map(String::as_str),
            Some("unenforced-refuse")
        );
        assert_eq!(PublishedSettings::from_data(&data), Ok(s.clone()));
        // A record from an operator that did not publish its tenant-store rules: unknown, not off.
        let mut older = data.clone();
        older.remove("tenantStoreEndpoints");
        older.remove("tenantStoreSecretNames");
        let read = PublishedSettings::from_data(&older).expect("older record");
        assert_eq!(read.tenant_stores, None);
        let off = PublishedSettings {
            tenant_stores: Some(TenantStorePolicy::default()),
            ..s.clone()
        };
        assert_eq!(
            PublishedSettings::from_data(&off.to_data()),
            Ok(off.clone())
        );
        let mut no_max = s;
        no_max.rules.max_drain_timeout = None;
        no_max.heartbeat = None;
        assert_eq!(
            PublishedSettings::from_data(&no_max.to_data()),
            Ok(no_max.clone())
        );
    }

    #[test]
    fn a_record_without_the_rule_settings_or_with_garbage_is_refused() {
        let mut data = sample().to_data();
        data.remove("maxCapBytes");
        assert_eq!(
            PublishedSettings::from_data(&data),
            Err(PublishedError::Missing("maxCapBytes"))
        );
        for (key, bad) in [
            ("defaultCapBytes", "1Gi"),
            ("networkPolicy", "sometimes"),
            ("drainWire", "gzip"),
            ("heartbeat", "yesterday"),
            ("checkImages", "yes"),
        ] {
            let mut data = sample().to_data();
            data.insert(key.into(), bad.into());
            assert!(
                matches!(PublishedSettings::from_data(&data), Err(PublishedError::Invalid { key: k, .. }) if k == key),
                "{key}={bad}"
            );
        }
        // Keys a newer operator adds are ignored; optional ones an older one lacks default.
        let mut data = sample().to_data();
        data.insert("somethingNew".into(), "x".into());
        data.remove("drainWire");
        let read = PublishedSettings::from_data(&data);
        assert_eq!(read.map(|s| s.drain_wire), Ok(Wire::Tar));
    }

    #[test]
    fn a_heartbeat_older_than_three_beats_is_stale() {
        let s = sample();
        let beat = s.heartbeat.unwrap_or_default();
        let at = |secs: i64| {
            beat.checked_add(jiff::SignedDuration::from_secs(secs))
                .unwrap_or_default()
        };
        assert_eq!(freshness(&s, at(0)), Freshness::Live);
        assert_eq!(freshness(&s, at(180)), Freshness::Live);
        assert_eq!(
            freshness(&s, at(181)),
            Freshness::Stale(Duration::from_secs(181))
        );
        assert_eq!(freshness(&s, at(-30)), Freshness::Live, "clock skew");
        let none = PublishedSettings {
            heartbeat: None,
            ..s
        };
        assert_eq!(freshness(&none, at(0)), Freshness::Unknown);
    }
}
