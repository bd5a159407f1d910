//! The chart's values docs/operations.md names and the chart's values.yaml: every value its
//! values table names is a key of values.yaml
//! ([`every_value_the_values_table_names_is_in_values_yaml`]). The other way round, every key of
//! values.yaml is in the chart's README, whose table `hack/chart-readme.py` generates from it
//! (`hack/gen.sh --check`).

use serde_yaml::Value;

use super::shipped;

const DOC: &str = "docs/operations.md";
const VALUES: &str = "charts/sandboxrun-operator/values.yaml";

/// The backquoted names of each first cell of docs/operations.md's values table, a row each.
fn named_values(doc: &str) -> Vec<Vec<String>> {
    let name = regex::Regex::new(r"`([^`]+)`").unwrap_or_else(|e| panic!("{e}"));
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.starts_with("| Value | Flag | Default |"));
    assert!(lines.next().is_some(), "{DOC} has no values table");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split(" | ").next())
        .map(|c| name.captures_iter(c).map(|m| m[1].to_string()).collect())
        .collect()
}

/// The value at a dotted path; `a.*` is `a` when it is a mapping.
fn lookup<'v>(values: &'v Value, path: &str) -> Option<&'v Value> {
    let (path, any_key) = match path.strip_suffix(".*") {
        Some(p) => (p, true),
        None => (path, false),
    };
    let found = path
        .split('.')
        .try_fold(values, |v, key| v.as_mapping()?.get(key))?;
    (!any_key || found.is_mapping()).then_some(found)
}

/// The names of one row that values.yaml lacks. A name after the first may be short for one
/// beside an earlier name (`readBack.defaultCap` / `maxCap`, `.memory`) or under one of its
/// parents (`egressProxy.enabled`, `networkPolicy.metricsFrom`).
fn missing_in_row(values: &Value, row: &[String]) -> Vec<String> {
    let mut prefixes: Vec<String> = vec![String::new()];
    let mut missing = Vec::new();
    for name in row {
        let short = name.trim_start_matches('.');
        let found = prefixes
            .iter()
            .map(|p| {
                if p.is_empty() {
                    short.to_string()
                } else {
                    format!("{p}.{short}")
                }
            })
            .find(|full| lookup(values, full).is_some());
        match found {
            Some(full) => {
                let mut parent = full.as_str();
                while let Some((up, _)) = parent.rsplit_once('.') {
                    prefixes.push(up.to_string());
                    parent = up;
                }
            }
            None => missing.push(name.clone()),
        }
    }
    missing
}

fn missing_values(values: &Value, doc: &str) -> Vec<String> {
    named_values(doc)
        .iter()
        .flat_map(|row| missing_in_row(values, row))
        .collect()
}

fn values_yaml() -> Value {
    serde_yaml::from_str(&shipped(VALUES)).unwrap_or_else(|e| panic!("{VALUES}: {e}"))
}

#[test]
fn every_value_the_values_table_names_is_in_values_yaml() {
    let missing = missing_values(&values_yaml(), &shipped(DOC));
    assert!(
        missing.is_empty(),
        "{DOC}'s values table names values {VALUES} does not have: {missing:?}"
    );
}

#[test]
fn a_value_the_chart_lacks_is_found_and_short_names_resolve_beside_the_first() {
    let values: Value = serde_yaml::from_str(
        "a: {b: 1, c: 2, d: {e: 3, f: 4}}\nreplicas: 1\nproxy: {replicas: 2, pdb: {x: 1}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let doc = "| Value | Flag | Default |\n|---|---|---|\n\
               | `a.b` / `c`, `a.d.e` / `.f` | x | y |\n\
               | `proxy.replicas`, `pdb.*`, `replicas` | x | y |\n\
               | (always) | x | y |\n\
               | `a.gone`, `b`, `a.b.*` | x | y |\n";
    assert_eq!(missing_values(&values, doc), ["a.gone", "b", "a.b.*"]);
}
