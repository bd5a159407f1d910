//! What the apiserver judges before any webhook: the CRD's structural schema. `doctor` walks a
//! manifest against the schema the CRD is generated with ([`crate::crdgen::crd`]) and reports
//! every field the schema does not know (ADR-006 §4: "will my run work on the cluster?").
//!
//! Why only `doctor`: the apiserver decodes a custom resource against its structural schema
//! before admission. A field the schema does not know is either rejected there (field validation
//! `Strict`, what `kubectl apply` and server-side apply with `--validate=strict` ask for) or pruned
//! with a warning (`Warn`/`Ignore`, what most API clients get by default). Either way the webhook
//! never sees it, so it has nothing to add; offline, nothing prunes the typo, and serde would
//! silently ignore it, which is how a `readback:` would have passed `doctor --strict` while the
//! cluster drained nothing.

use std::sync::OnceLock;

use serde_json::Value;

use crate::policy::rules::{ids, Finding};

/// Fields of `metadata` (ObjectMeta) a manifest may carry; the CRD schema leaves `metadata` to
/// the apiserver, which knows exactly these.
const OBJECT_META_FIELDS: &[&str] = &[
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

/// Top-level fields every object has besides those in the schema's `properties`.
const ENVELOPE_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// The `openAPIV3Schema` of the SandboxRun CRD (computed once).
fn root_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        crate::crdgen::crd()
            .ok()
            .and_then(|crd| crd.spec.versions.into_iter().next())
            .and_then(|v| v.schema)
            .and_then(|s| s.open_api_v3_schema)
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(Value::Null)
    })
}

/// Every field of `doc` (a whole SandboxRun manifest) that the CRD's structural schema does not
/// know, as failing `unknown-field` findings with a "did you mean" hint where a known field is
/// close. Values of the right name but the wrong type are not judged here (deserializing the run
/// does that).
pub(crate) fn unknown_fields(doc: &Value) -> Vec<Finding> {
    let mut out = Vec::new();
    let Value::Object(top) = doc else {
        return out;
    };
    let schema = root_schema();
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut known: Vec<&str> = ENVELOPE_FIELDS.to_vec();
    known.extend(properties.iter().flat_map(|p| p.keys().map(String::as_str)));
    for (key, value) in top {
        if key == "metadata" {
            if let Value::Object(meta) = value {
                for k in meta.keys() {
                    if !OBJECT_META_FIELDS.contains(&k.as_str()) {
                        out.push(finding("metadata", k, OBJECT_META_FIELDS));
                    }
                }
            }
        } else if let Some(sub) = properties.and_then(|p| p.get(key)) {
            walk(value, sub, key, &mut out);
        } else if !ENVELOPE_FIELDS.contains(&key.as_str()) {
            out.push(finding("", key, &known));
        }
    }
    out
}

/// Walks `value` against `schema` at `path`.
fn walk(value: &Value, schema: &Value, path: &str, out: &mut Vec<Finding>) {
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                let known: Vec<&str> = props.keys().map(String::as_str).collect();
                for (k, v) in map {
                    match props.get(k) {
                        Some(sub) => walk(v, sub, &format!("{path}.{k}"), out),
                        None => out.push(finding(path, k, &known)),
                    }
                }
            } else if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for (k, v) in map {
                    walk(v, sub, &format!("{path}.{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for (i, v) in items.iter().enumerate() {
                    walk(v, sub, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Every value of `doc` (a whole SandboxRun manifest) outside its type or its `enum` in the CRD's
/// structural schema, as failing `invalid-value` findings that list the valid values, and `doc`
/// without them: the apiserver refuses such a manifest before any webhook, and `doctor` goes on to
/// judge the rest of it (a bad value is a config finding, exit 1, not a usage error).
pub(crate) fn invalid_values(doc: &Value) -> (Vec<Finding>, Value) {
    let mut out = Vec::new();
    let mut cleaned = doc.clone();
    if let (Value::Object(top), Some(props)) = (
        &mut cleaned,
        root_schema().get("properties").and_then(Value::as_object),
    ) {
        top.retain(|key, value| match props.get(key) {
            Some(sub) if key != "metadata" => keep_valid(value, sub, key, &mut out),
            _ => true,
        });
    }
    (out, cleaned)
}

/// Checks `value` against `schema` at `path`: drops the invalid values inside it and returns
/// whether `value` itself is valid (a finding is pushed when it is not).
fn keep_valid(value: &mut Value, schema: &Value, path: &str, out: &mut Vec<Finding>) -> bool {
    if value.is_null()
        || schema
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true)
    {
        return true;
    }
    if let Some(why) = type_mismatch(value, schema) {
        out.push(Finding::fail(
            ids::INVALID_VALUE,
            path,
            format!("{path} is {}: not {why}", short_json(value)),
            format!("write {why}"),
        ));
        return false;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let names: Vec<String> = allowed.iter().map(short_json).collect();
            out.push(Finding::fail(
                ids::INVALID_VALUE,
                path,
                format!(
                    "{path} is {}: not one of its values, so the apiserver refuses the manifest",
                    short_json(value)
                ),
                format!("one of: {}", names.join(", ")),
            ));
            return false;
        }
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|s| s.is_object());
            map.retain(|k, v| match props.and_then(|p| p.get(k)).or(extra) {
                Some(sub) => keep_valid(v, sub, &format!("{path}.{k}"), out),
                None => true,
            });
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                let mut i = 0;
                items.retain_mut(|v| {
                    let keep = keep_valid(v, sub, &format!("{path}[{i}]"), out);
                    i += 1;
                    keep
                });
            }
        }
        _ => {}
    }
    true
}

/// Why `value` is not of the schema's `type`, in words ("a string", …), or None when it is (or
/// the schema says int-or-string and it is either).
fn type_mismatch(value: &Value, schema: &Value) -> Option<&'static str> {
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        let ok = value.is_string() || value.as_i64().is_some() || value.as_u64().is_some();
        return (!ok).then_some("an integer or a string");
    }
    let (ok, words) = match schema.get("type").and_then(Value::as_str)? {
        "string" => (value.is_string(), "a string"),
        "integer" => (
            value.as_i64().is_some() || value.as_u64().is_some(),
            "an integer",
        ),
        "number" => (value.is_number(), "a number"),
        "boolean" => (value.is_boolean(), "true or false"),
        "array" => (value.is_array(), "a list"),
        "object" => (value.is_object(), "a map"),
        _ => return None,
    };
    (!ok).then_some(words)
}

/// A value as JSON, cut to 80 characters on a char boundary.
fn short_json(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The finding for `field` under `parent`, with the closest of `known` as the hint.
fn finding(parent: &str, field: &str, known: &[&str]) -> Finding {
    let at = if parent.is_empty() {
        field.to_string()
    } else {
        format!("{parent}.{field}")
    };
    let within = if parent.is_empty() {
        "the top level"
    } else {
        parent
    };
    let message = format!(
        "unknown field `{field}` in {within}: the apiserver rejects it (strict field validation, as \
         kubectl apply asks for) or silently drops it, so it would have no effect"
    );
    let hint = match closest(field, known) {
        Some(name) => format!("did you mean {name}? Field names are case-sensitive camelCase"),
        None => {
            let mut names = known.to_vec();
            names.sort_unstable();
            format!("remove it; {within} knows: {}", names.join(", "))
        }
    };
    Finding::fail(ids::UNKNOWN_FIELD, at, message, hint)
}

/// The known name `field` was most likely meant to be: the same word in another case, or one
/// within a small edit distance (a typo) or with a high Jaro-Winkler similarity (a prefix kept).
pub(crate) fn closest<'a>(field: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = field.to_ascii_lowercase();
    if let Some(same) = known.iter().find(|k| k.to_ascii_lowercase() == lower) {
        return Some(same);
    }
    known
        .iter()
        .map(|k| {
            let kl = k.to_ascii_lowercase();
            let edits = strsim::damerau_levenshtein(&lower, &kl);
            let similar = strsim::jaro_winkler(&lower, &kl);
            (k, edits, similar)
        })
        .filter(|(k, edits, similar)| {
            // Two edits in a word of at least five letters, one in a shorter one.
            let budget = if k.len() >= 5 { 2 } else { 1 };
            *edits <= budget || *similar >= 0.9
        })
        .min_by(|a, b| a.1.cmp(&b.1).then(b.2.total_cmp(&a.2)))
        .map(|(k, _, _)| *k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> Value {
        serde_yaml::from_str(yaml).unwrap_or(Value::Null)
    }

    #[test]
    fn a_lowercase_read_back_is_unknown_with_a_hint() {
        let f = unknown_fields(&doc(
            "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: a}\nspec:\n  image: x\n  readback:\n    paths: [{path: /out}]\n",
        ));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].rule, "unknown-field");
        assert!(f[0].is_fail());
        assert_eq!(f[0].field, "spec.readback");
        assert!(f[0].hint.contains("did you mean readBack"), "{}", f[0].hint);
    }

    #[test]
    fn nested_lists_maps_and_metadata_are_walked_and_free_form_fields_are_not() {
        let f = unknown_fields(&doc("apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {name: a, label: {x: y}}
spec:
  image: x
  build: {anything: goes, here: [1]}
  nodeSelector: {disk: ssd}
  resources: {limits: {cpu: 1}, requets: {cpu: 1}}
  tolerations: [{key: k, operater: Exists}]
  readBack:
    paths: [{path: /out, sizelimit: 1Gi}, {path: /b, requried: true}]
    drainTimeout: 5m
specs: {}
"));
        let fields: Vec<(&str, &str)> = f
            .iter()
            .map(|f| (f.field.as_str(), f.hint.as_str()))
            .collect();
        assert_eq!(fields.len(), 6, "{fields:#?}");
        for (field, hint) in [
            ("metadata.label", "did you mean labels?"),
            ("spec.resources.requets", "did you mean requests?"),
            ("spec.tolerations[0].operater", "did you mean operator?"),
            (
                "spec.readBack.paths[0].sizelimit",
                "did you mean sizeLimit?",
            ),
            ("spec.readBack.paths[1].requried", "did you mean required?"),
            ("specs", "did you mean spec?"),
        ] {
            assert!(
                fields
                    .iter()
                    .any(|(f, h)| *f == field && h.starts_with(hint)),
                "{field}: {fields:#?}"
            );
        }
    }

    #[test]
    fn a_field_like_nothing_known_lists_what_is_known() {
        let f = unknown_fields(&doc("kind: SandboxRun\nspec: {image: x, zzzqqq: 1}\n"));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].hint
                .starts_with("remove it; spec knows: activeDeadlineSeconds, affinity, args"),
            "{}",
            f[0].hint
        );
    }

    #[test]
    fn closest_prefers_the_same_word_then_the_fewest_edits() {
        assert_eq!(closest("READBACK", &["readBack", "read"]), Some("readBack"));
        assert_eq!(closest("imgae", &["image", "user"]), Some("image"));
        assert_eq!(closest("usr", &["image", "user"]), Some("user"));
        assert_eq!(closest("completely", &["image", "user"]), None);
    }

    #[test]
    fn a_value_outside_its_enum_or_type_is_a_finding_and_is_left_out() {
        let doc = serde_json::json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "x"},
            "spec": {
                "image": "busybox",
                "user": 1000,
                "env": [{"name": "A", "value": "1"}, "oops"],
                "readBack": {
                    "paths": [{"path": "/out", "sizeLimit": "1Gi"}],
                    "compression": "brotli",
                    "retention": "Delete"
                }
            }
        });
        let (findings, cleaned) = invalid_values(&doc);
        let fields: Vec<&str> = findings.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.env[1]", "spec.readBack.compression", "spec.user"],
            "{findings:?}"
        );
        assert!(findings.iter().all(|f| f.rule == ids::INVALID_VALUE));
        assert!(
            findings[1].hint.contains(r#""none", "gzip", "zstd""#),
            "{findings:?}"
        );
        let spec = &cleaned["spec"];
        assert!(spec.get("user").is_none() && spec["readBack"].get("compression").is_none());
        assert_eq!(spec["env"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            spec["readBack"]["retention"], "Delete",
            "valid values are kept"
        );
        assert_eq!(spec["readBack"]["paths"][0]["sizeLimit"], "1Gi");
        assert!(
            invalid_values(&cleaned).0.is_empty(),
            "what is left is valid"
        );
    }
}
