//! `sandboxrun_pool_claimed`, the one metric the operator serves through the external metrics API
//! (`external.metrics.k8s.io/v1beta1`, `run --external-metrics`; docs/user-guide.md "Scaling a
//! pool with a HorizontalPodAutoscaler"): each pool's claimed pods, as its status says them, one
//! item per pool of the namespace the request names whose labels (`pool: <name>`) the request's
//! label selector selects. Pure: the pools, the namespace, the metric and the selector are
//! arguments; [`super::serve`] serves it.
//!
//! A request never reads another namespace's pools (docs/contract.md "A pool's claims are served
//! to an autoscaler of its namespace only").

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde_json::{json, Value};

use crate::api::SandboxRunPool;

/// The metric's name, as an HPA's `External` metric names it.
pub const CLAIMED_METRIC: &str = "sandboxrun_pool_claimed";
/// The API group and version served.
pub const GROUP: &str = "external.metrics.k8s.io";
/// See [`GROUP`].
pub const VERSION: &str = "v1beta1";
/// The label each item carries: its pool's name.
pub const POOL_LABEL: &str = "pool";
/// The longest label selector read (an HPA's is a few terms).
const MAX_SELECTOR: usize = 4096;

/// Why a request gets no value list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A metric the operator does not serve.
    #[error("no external metric {0:?} (this server serves {CLAIMED_METRIC} only)")]
    UnknownMetric(String),
    /// The label selector does not parse.
    #[error("label selector {0:?}: {1}")]
    Selector(String, &'static str),
}

/// One term of a label selector (the apiserver's string form).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    /// `k=v`, `k==v`, `k in (v1,v2)`.
    In(String, Vec<String>),
    /// `k!=v`, `k notin (v1,v2)`.
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    DoesNotExist(String),
}

impl Term {
    fn matches(&self, labels: &BTreeMap<&str, &str>) -> bool {
        match self {
            Term::In(k, vs) => labels
                .get(k.as_str())
                .is_some_and(|v| vs.iter().any(|w| w == v)),
            Term::NotIn(k, vs) => !labels
                .get(k.as_str())
                .is_some_and(|v| vs.iter().any(|w| w == v)),
            Term::Exists(k) => labels.contains_key(k.as_str()),
            Term::DoesNotExist(k) => !labels.contains_key(k.as_str()),
        }
    }
}

/// The terms of `selector` split at the commas outside parentheses.
fn split_terms(selector: &str) -> Vec<&str> {
    let (mut terms, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// The values of `(v1, v2)`.
fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn term(raw: &str) -> Result<Term, &'static str> {
    let t = raw.trim();
    if t.is_empty() {
        return Err("an empty term");
    }
    if let Some((k, v)) = t.split_once("!=") {
        return Ok(Term::NotIn(k.trim().into(), vec![v.trim().into()]));
    }
    if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
        return Ok(Term::In(k.trim().into(), vec![v.trim().into()]));
    }
    if let Some((k, rest)) = t.split_once(" notin ") {
        let values = set_values(rest).ok_or("notin takes (values)")?;
        return Ok(Term::NotIn(k.trim().into(), values));
    }
    if let Some((k, rest)) = t.split_once(" in ") {
        let values = set_values(rest).ok_or("in takes (values)")?;
        return Ok(Term::In(k.trim().into(), values));
    }
    if let Some(k) = t.strip_prefix('!') {
        return Ok(Term::DoesNotExist(k.trim().into()));
    }
    if t.contains(|c: char| c.is_whitespace() || "()!=<>".contains(c)) {
        return Err("an operator this server does not read");
    }
    Ok(Term::Exists(t.into()))
}

/// The terms of a label selector in the apiserver's string form (empty: every item).
fn parse_selector(selector: &str) -> Result<Vec<Term>, Refused> {
    let refuse = |why| Refused::Selector(selector.chars().take(200).collect(), why);
    if selector.len() > MAX_SELECTOR {
        return Err(refuse("too long"));
    }
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    split_terms(selector)
        .into_iter()
        .map(term)
        .collect::<Result<_, _>>()
        .map_err(refuse)
}

/// The `ExternalMetricValueList` answering `metric` in `namespace` with `selector`, of the
/// `pools` (any namespace's: only `namespace`'s are read), stamped `now` (RFC 3339). A pool
/// without a status yet (never looked at) has no item: no value is made up for it.
pub fn value_list<'a>(
    pools: impl IntoIterator<Item = &'a SandboxRunPool>,
    namespace: &str,
    metric: &str,
    selector: &str,
    now: &str,
) -> Result<Value, Refused> {
    if metric != CLAIMED_METRIC {
        return Err(Refused::UnknownMetric(metric.chars().take(200).collect()));
    }
    let terms = parse_selector(selector)?;
    let mut items: Vec<(String, i32)> = pools
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.claimed)))
        .filter(|(name, _)| {
            let labels = BTreeMap::from([(POOL_LABEL, name.as_str())]);
            terms.iter().all(|t| t.matches(&labels))
        })
        .collect();
    items.sort();
    let items: Vec<Value> = items
        .into_iter()
        .map(|(pool, claimed)| {
            json!({
                "metricName": CLAIMED_METRIC,
                "metricLabels": {POOL_LABEL: pool},
                "timestamp": now,
                "value": claimed.max(0).to_string(),
            })
        })
        .collect();
    Ok(json!({
        "kind": "ExternalMetricValueList",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {},
        "items": items,
    }))
}

/// The discovery document of `/apis/external.metrics.k8s.io/v1beta1` (what makes the APIService
/// Available): the one metric, namespaced, read-only.
pub fn resource_list() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": [{
            "name": CLAIMED_METRIC,
            "singularName": "",
            "namespaced": true,
            "kind": "ExternalMetricValueList",
            "verbs": ["get"],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxRunPoolSpec, SandboxRunPoolStatus, TemplateRef};

    fn pool(ns: &str, name: &str, claimed: Option<i32>) -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            name,
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 2,
            },
        );
        pool.metadata.namespace = Some(ns.into());
        pool.status = claimed.map(|claimed| SandboxRunPoolStatus {
            claimed,
            ..Default::default()
        });
        pool
    }

    fn values(list: &Value) -> Vec<(String, String)> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["metricLabels"]["pool"].as_str().unwrap().to_string(),
                    i["value"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn pools() -> Vec<SandboxRunPool> {
        vec![
            pool("team-a", "agents", Some(3)),
            pool("team-a", "builders", Some(1)),
            pool("team-a", "new", None),
            pool("team-b", "agents", Some(7)),
        ]
    }

    #[test]
    fn a_pools_claimed_pods_are_its_value_and_the_selector_picks_the_pool() {
        let list = value_list(&pools(), "team-a", CLAIMED_METRIC, "pool=agents", "t").unwrap();
        assert_eq!(values(&list), [("agents".into(), "3".into())]);
        assert_eq!(list["kind"], "ExternalMetricValueList");
        assert_eq!(list["items"][0]["metricName"], CLAIMED_METRIC);
        let all = value_list(&pools(), "team-a", CLAIMED_METRIC, "", "t").unwrap();
        assert_eq!(
            values(&all),
            [
                ("agents".into(), "3".into()),
                ("builders".into(), "1".into())
            ],
            "a pool without a status has no item"
        );
        let set = value_list(
            &pools(),
            "team-a",
            CLAIMED_METRIC,
            "pool in (builders, x)",
            "t",
        );
        assert_eq!(values(&set.unwrap()), [("builders".into(), "1".into())]);
        let not = value_list(&pools(), "team-a", CLAIMED_METRIC, "pool!=agents", "t");
        assert_eq!(values(&not.unwrap()), [("builders".into(), "1".into())]);
        let other_label = value_list(&pools(), "team-a", CLAIMED_METRIC, "state=claimed", "t");
        assert!(values(&other_label.unwrap()).is_empty());
    }

    #[test]
    fn a_request_reads_only_the_namespace_its_path_names() {
        let b = value_list(&pools(), "team-b", CLAIMED_METRIC, "pool=agents", "t").unwrap();
        assert_eq!(values(&b), [("agents".into(), "7".into())]);
        let c = value_list(&pools(), "team-c", CLAIMED_METRIC, "", "t").unwrap();
        assert!(values(&c).is_empty(), "{c}");
        let a = value_list(&pools(), "team-a", CLAIMED_METRIC, "pool in (agents)", "t").unwrap();
        assert_eq!(
            values(&a),
            [("agents".into(), "3".into())],
            "team-b's 7 is not team-a's"
        );
    }

    #[test]
    fn another_metric_and_an_unreadable_selector_are_refused() {
        assert!(matches!(
            value_list(&pools(), "team-a", "sandboxrun_pool_pods", "", "t"),
            Err(Refused::UnknownMetric(_))
        ));
        for bad in ["pool in agents", "pool,,x", "pool > 3", &"p".repeat(5000)] {
            assert!(
                matches!(
                    value_list(&pools(), "team-a", CLAIMED_METRIC, bad, "t"),
                    Err(Refused::Selector(..))
                ),
                "{bad:.20}"
            );
        }
    }

    #[test]
    fn discovery_names_the_one_metric() {
        let list = resource_list();
        assert_eq!(list["groupVersion"], "external.metrics.k8s.io/v1beta1");
        assert_eq!(list["resources"][0]["name"], CLAIMED_METRIC);
    }
}
