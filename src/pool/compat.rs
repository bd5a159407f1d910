//! Whether a run may take a warm pool pod: a pool pod is built from the template alone, so a run
//! may start in one only when nothing the run sets would have changed that pod. What the launcher
//! delivers at claim time (command, args, env values, those of a Secret's or ConfigMap's key read
//! by the operator then: `super::env`) and what never reaches the pod (stop,
//! the deadline, which counts from the run's own start) may differ, and so may `workspace` (a
//! restore runs in the claimed pod before its start); any other field means a cold
//! start, and the reason names the field.

use crate::api::SandboxRunSpec;

/// The top-level spec fields (camelCase, as the CRD spells them) a run may set and still take a
/// pool pod.
const WARM_FIELDS: [&str; 7] = [
    "command",
    "args",
    "env",
    "stop",
    "activeDeadlineSeconds",
    "templateRef",
    // A pool pod is parked with its holder's read-back mounts writable, as a pod parked for a
    // restore is: its restore runs in it before the start is handed over (issue #54).
    "workspace",
];

/// Why a run cannot take a pool pod and starts cold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    /// The run sets a field that changes the pod.
    #[error("the run sets spec.{0}, which changes the pod")]
    Field(String),
    /// An env var takes its value from a source the launcher cannot deliver (not exactly one
    /// key of a Secret or ConfigMap): the pod would have to reference it.
    #[error("env var {0} takes its value from a source the launcher cannot deliver, which changes the pod")]
    EnvFrom(String),
    /// The run is a fork (`spec.workspace.from`): its pod must be created for its source (the
    /// source's name on the parked pod, checked before the restore, docs/contract.md "Pause,
    /// resume and fork"), which no pool pod is.
    #[error("the run forks run {0} (spec.workspace.from): a fork's pod is created for its source")]
    Fork(String),
    /// The run's spec could not be read as JSON (never expected).
    #[error("the run's spec could not be read")]
    Unreadable,
}

/// Whether the run's own spec (as its author wrote it, before the template is merged) lets it
/// take a pool pod built from its template. `Ok(())` when it may.
pub fn compatible(own: &SandboxRunSpec) -> Result<(), Incompatible> {
    let value = serde_json::to_value(own).map_err(|_| Incompatible::Unreadable)?;
    let Some(fields) = value.as_object() else {
        return Err(Incompatible::Unreadable);
    };
    let mut set: Vec<&String> = fields
        .iter()
        .filter(|(_, v)| is_set(v))
        .map(|(k, _)| k)
        .collect();
    set.sort();
    if let Some(field) = set.iter().find(|k| !WARM_FIELDS.contains(&k.as_str())) {
        return Err(Incompatible::Field((*field).clone()));
    }
    if let Some(from) = own.workspace.as_ref().and_then(|w| w.from.as_ref()) {
        return Err(Incompatible::Fork(from.run.clone()));
    }
    // A key of a Secret or ConfigMap is read at claim time and delivered (issue #54).
    let deliverable = |from: &crate::api::EnvVarSource| {
        from.secret_key_ref.is_some() != from.config_map_key_ref.is_some()
    };
    if let Some(var) = own
        .env
        .iter()
        .find(|v| v.value_from.as_ref().is_some_and(|f| !deliverable(f)))
    {
        return Err(Incompatible::EnvFrom(var.name.clone()));
    }
    Ok(())
}

/// A field counts as set unless it is absent-equivalent: null, false, an empty list or map.
fn is_set(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null | serde_json::Value::Bool(false) => false,
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, EnvVarSource};

    fn spec(json: serde_json::Value) -> SandboxRunSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_run_that_sets_only_what_the_launcher_delivers_is_compatible() {
        let own = spec(serde_json::json!({
            "templateRef": {"name": "agent"},
            "command": ["python3", "-c", "print(1)"],
            "args": ["x"],
            "env": [{"name": "TASK", "value": "42"}],
            "stop": false,
            "activeDeadlineSeconds": 600
        }));
        assert_eq!(compatible(&own), Ok(()));
        assert_eq!(compatible(&SandboxRunSpec::default()), Ok(()));
    }

    #[test]
    fn a_field_that_changes_the_pod_means_a_cold_start_naming_it() {
        for (json, field) in [
            (serde_json::json!({"image": "busybox"}), "image"),
            (serde_json::json!({"user": "1000"}), "user"),
            (serde_json::json!({"workingDir": "/tmp"}), "workingDir"),
            (
                serde_json::json!({"nodeSelector": {"a": "b"}}),
                "nodeSelector",
            ),
            (
                serde_json::json!({"command": ["x"], "podLabels": {"a": "b"}}),
                "podLabels",
            ),
        ] {
            assert_eq!(
                compatible(&spec(json)),
                Err(Incompatible::Field(field.to_string()))
            );
        }
    }

    #[test]
    fn an_env_value_from_a_secret_means_a_cold_start() {
        let own = SandboxRunSpec {
            env: vec![EnvVar {
                name: "TOKEN".into(),
                value: String::new(),
                value_from: Some(EnvVarSource::default()),
            }],
            ..Default::default()
        };
        let err = compatible(&own).unwrap_err();
        assert_eq!(err, Incompatible::EnvFrom("TOKEN".into()));
        assert!(err.to_string().contains("TOKEN"));
    }

    /// Issue #54: a run that restores its workspace takes a pool pod too (its restore runs in
    /// the claimed pod before the start); fails on the old code (`Field("workspace")`).
    #[test]
    fn a_run_that_restores_its_workspace_is_compatible() {
        let own = spec(serde_json::json!({
            "templateRef": {"name": "agent"},
            "command": ["sh"],
            "workspace": {"restore": "Latest"}
        }));
        assert_eq!(compatible(&own), Ok(()));
    }

    /// A fork starts cold: its pod must be created for its source (a pool pod is not, and the
    /// restore refuses a fork's pod that names no source). Fails on the merged code before this
    /// check: `Ok(())`, and every fork made from a pooled template failed its restore.
    #[test]
    fn a_fork_starts_cold_naming_its_source() {
        let own = spec(serde_json::json!({
            "templateRef": {"name": "agent"},
            "command": ["sh"],
            "workspace": {"restore": "Latest", "from": {"run": "agent-1"}}
        }));
        assert_eq!(compatible(&own), Err(Incompatible::Fork("agent-1".into())));
    }

    /// Issue #54: a key of a Secret or ConfigMap is read by the operator at claim time and
    /// delivered by the launcher, so it no longer changes the pod (fails on the old code).
    #[test]
    fn an_env_value_from_a_secret_or_config_map_key_stays_warm() {
        let own = spec(serde_json::json!({
            "templateRef": {"name": "agent"},
            "command": ["sh"],
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}}
            ]
        }));
        assert_eq!(compatible(&own), Ok(()));
    }
}
