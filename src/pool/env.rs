//! Env values a warm claim reads for the launcher (docs/contract.md "Sandboxes for agents: warm
//! pools", issue #54): a variable of the run's workload that takes its value from a key of a
//! Secret or ConfigMap (`secretKeyRef`, `configMapKeyRef`) is read by the operator at claim time,
//! in the run's own namespace, and delivered in the launcher's start message, as the kubelet
//! would have put it in a cold pod's env. Pure: which objects to read ([`sources`]), and the
//! start message they make ([`with_env`]) or why the run starts cold instead
//! ([`Unresolved`]). The values are never in a `Debug`, a log line, an error or a status: only
//! the names of the variable, the object and the key are.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVarSource, Pod};

use crate::inpod::launch::StartMessage;
use crate::pod::WORKLOAD_CONTAINER;

/// The kind of object a value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Secret,
    ConfigMap,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        })
    }
}

/// An object values come from, in the run's namespace: its kind and name.
pub type Source = (Kind, String);

/// What the read of one object answered.
#[derive(Clone, PartialEq, Eq)]
pub enum Object {
    /// It does not exist.
    Absent,
    /// The operator may not read it (its chart's `warmPools.envSources` is off).
    Forbidden,
    /// Its keys and their values.
    Found(BTreeMap<String, Vec<u8>>),
}

/// The objects the claim read, by [`Source`]. Its `Debug` names the objects and their keys,
/// never a value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Read(BTreeMap<Source, Object>);

impl Read {
    /// Records what the read of `source` answered.
    pub fn insert(&mut self, source: Source, object: Object) {
        self.0.insert(source, object);
    }
}

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for ((kind, name), object) in &self.0 {
            let said = match object {
                Object::Absent => "absent".to_string(),
                Object::Forbidden => "forbidden".to_string(),
                Object::Found(keys) => format!("keys {:?}", keys.keys().collect::<Vec<_>>()),
            };
            map.entry(&format!("{kind}/{name}"), &said);
        }
        map.finish()
    }
}

/// Why the run cannot take a pool pod with the env it needs (it starts cold: its cold pod gets
/// the kubelet's outcome, `CreateContainerConfigError` for a missing required Secret or key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    #[error("env var {var} takes its value from {kind} {name}, which does not exist")]
    Missing {
        var: String,
        kind: Kind,
        name: String,
    },
    #[error(
        "env var {var} takes its value from key {key} of {kind} {name}, which has no such key"
    )]
    NoKey {
        var: String,
        kind: Kind,
        name: String,
        key: String,
    },
    #[error(
        "env var {var}: the operator may not read {kind} {name} (the chart's warmPools.envSources)"
    )]
    Forbidden {
        var: String,
        kind: Kind,
        name: String,
    },
    #[error("env var {var}: the value of key {key} of {kind} {name} is not UTF-8 text")]
    NotText {
        var: String,
        kind: Kind,
        name: String,
        key: String,
    },
    #[error("env var {0} takes its value from a source the launcher cannot deliver")]
    Unsupported(String),
    #[error("the start message with the env read from Secrets and ConfigMaps would be refused by the launcher: {0}")]
    Refused(String),
}

/// The one object and key `from` names, with whether it may be absent; None when it names
/// anything else (a `fieldRef`, a `resourceFieldRef`, two sources or none): the pod must carry
/// it, and the run starts cold.
pub fn deliverable(from: &EnvVarSource) -> Option<(Source, String, bool)> {
    if from.field_ref.is_some() || from.resource_field_ref.is_some() {
        return None;
    }
    match (&from.secret_key_ref, &from.config_map_key_ref) {
        (Some(s), None) => Some((
            (Kind::Secret, s.name.clone()),
            s.key.clone(),
            s.optional == Some(true),
        )),
        (None, Some(c)) => Some((
            (Kind::ConfigMap, c.name.clone()),
            c.key.clone(),
            c.optional == Some(true),
        )),
        _ => None,
    }
}

/// The workload container's env of `cold`, as the pod carries it.
fn workload_env(cold: &Pod) -> &[k8s_openapi::api::core::v1::EnvVar] {
    cold.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == WORKLOAD_CONTAINER))
        .and_then(|c| c.env.as_deref())
        .unwrap_or_default()
}

/// The objects to read for `cold`'s workload env, each once, in order.
pub fn sources(cold: &Pod) -> Vec<Source> {
    let mut all: Vec<Source> = workload_env(cold)
        .iter()
        .filter_map(|e| e.value_from.as_ref().and_then(deliverable))
        .map(|(source, _, _)| source)
        .collect();
    all.sort();
    all.dedup();
    all
}

/// `cold`'s workload env in its order, each `secretKeyRef`/`configMapKeyRef` replaced by the
/// value `read` holds; an optional one whose object or key is absent is left out, as the kubelet
/// does.
pub fn resolve(cold: &Pod, read: &Read) -> Result<Vec<(String, String)>, Unresolved> {
    let mut env = Vec::new();
    for var in workload_env(cold) {
        let Some(from) = &var.value_from else {
            env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
            continue;
        };
        let ((kind, name), key, optional) =
            deliverable(from).ok_or_else(|| Unresolved::Unsupported(var.name.clone()))?;
        let named = |var: &str| (var.to_string(), kind, name.clone());
        let keys = match read.0.get(&(kind, name.clone())) {
            Some(Object::Found(keys)) => keys,
            Some(Object::Forbidden) => {
                let (var, kind, name) = named(&var.name);
                return Err(Unresolved::Forbidden { var, kind, name });
            }
            _ if optional => continue,
            _ => {
                let (var, kind, name) = named(&var.name);
                return Err(Unresolved::Missing { var, kind, name });
            }
        };
        let Some(bytes) = keys.get(&key) else {
            if optional {
                continue;
            }
            let (var, kind, name) = named(&var.name);
            return Err(Unresolved::NoKey {
                var,
                kind,
                name,
                key,
            });
        };
        let Ok(value) = String::from_utf8(bytes.clone()) else {
            let (var, kind, name) = named(&var.name);
            return Err(Unresolved::NotText {
                var,
                kind,
                name,
                key,
            });
        };
        env.push((var.name.clone(), value));
    }
    Ok(env)
}

/// `base` (the launcher's start message for `cold`, `super::pod::start_message`) with its env
/// resolved from `read`; refused here, before any claim, when the launcher would refuse it
/// (larger than [`crate::inpod::launch::MAX_START_BYTES`], a NUL in a value: the launcher's own
/// check).
pub fn with_env(
    mut base: StartMessage,
    cold: &Pod,
    read: &Read,
) -> Result<StartMessage, Unresolved> {
    base.env = resolve(cold, read)?;
    let bytes = serde_json::to_vec(&base).map_err(|e| Unresolved::Refused(e.to_string()))?;
    StartMessage::parse(&bytes).map_err(|e| Unresolved::Refused(e.to_string()))?;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapKeySelector, Container, EnvVar, ObjectFieldSelector, PodSpec, SecretKeySelector,
    };

    fn secret_ref(var: &str, name: &str, key: &str, optional: bool) -> EnvVar {
        EnvVar {
            name: var.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: name.into(),
                    key: key.into(),
                    optional: optional.then_some(true),
                }),
                ..Default::default()
            }),
        }
    }

    fn config_ref(var: &str, name: &str, key: &str) -> EnvVar {
        EnvVar {
            name: var.into(),
            value: None,
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: name.into(),
                    key: key.into(),
                    optional: None,
                }),
                ..Default::default()
            }),
        }
    }

    fn plain(var: &str, value: &str) -> EnvVar {
        EnvVar {
            name: var.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn cold(env: Vec<EnvVar>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: WORKLOAD_CONTAINER.into(),
                    command: Some(vec!["sh".into(), "-c".into(), "env".into()]),
                    env: Some(env),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The start message the claim makes: the pod's, its env resolved.
    fn start_message(
        cold: &Pod,
        uid: &str,
        read: &Read,
    ) -> Result<Option<StartMessage>, Unresolved> {
        crate::pool::pod::start_message(cold, uid)
            .map(|base| with_env(base, cold, read))
            .transpose()
    }

    fn found(pairs: &[(&str, &[u8])]) -> Object {
        Object::Found(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        )
    }

    #[test]
    fn the_objects_to_read_are_each_secret_and_config_map_once() {
        let pod = cold(vec![
            plain("A", "1"),
            secret_ref("TOKEN", "creds", "token", false),
            secret_ref("USER", "creds", "user", false),
            config_ref("MODE", "settings", "mode"),
        ]);
        assert_eq!(
            sources(&pod),
            [
                (Kind::Secret, "creds".to_string()),
                (Kind::ConfigMap, "settings".to_string())
            ]
        );
    }

    #[test]
    fn the_start_message_carries_the_values_read_in_the_pods_env_order() {
        let pod = cold(vec![
            plain("A", "1"),
            secret_ref("TOKEN", "creds", "token", false),
            config_ref("MODE", "settings", "mode"),
        ]);
        let mut read = Read::default();
        read.insert(
            (Kind::Secret, "creds".into()),
            found(&[("token", b"s3cr3t")]),
        );
        read.insert(
            (Kind::ConfigMap, "settings".into()),
            found(&[("mode", b"fast")]),
        );
        let msg = start_message(&pod, "uid", &read).unwrap().unwrap();
        assert_eq!(
            msg.env,
            [
                ("A".to_string(), "1".to_string()),
                ("TOKEN".to_string(), "s3cr3t".to_string()),
                ("MODE".to_string(), "fast".to_string())
            ]
        );
        assert_eq!(msg.argv, ["sh", "-c", "env"]);
        assert_eq!(msg.run, "uid");
    }

    #[test]
    fn a_missing_required_secret_or_key_is_a_cold_start_naming_it_never_its_values() {
        let pod = cold(vec![secret_ref("TOKEN", "creds", "token", false)]);
        let err = start_message(&pod, "uid", &Read::default()).unwrap_err();
        assert_eq!(
            err,
            Unresolved::Missing {
                var: "TOKEN".into(),
                kind: Kind::Secret,
                name: "creds".into()
            }
        );
        let mut read = Read::default();
        read.insert(
            (Kind::Secret, "creds".into()),
            found(&[("other", b"s3cr3t")]),
        );
        let err = start_message(&pod, "uid", &read).unwrap_err();
        assert!(matches!(err, Unresolved::NoKey { ref key, .. } if key == "token"));
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert!(!format!("{read:?}").contains("s3cr3t"), "{read:?}");
        read.insert((Kind::Secret, "creds".into()), Object::Forbidden);
        let err = start_message(&pod, "uid", &read).unwrap_err();
        assert!(matches!(err, Unresolved::Forbidden { .. }), "{err}");
    }

    #[test]
    fn an_optional_secret_or_key_that_is_absent_leaves_the_variable_out() {
        let pod = cold(vec![
            secret_ref("GONE", "nowhere", "k", true),
            secret_ref("NOKEY", "creds", "absent", true),
            plain("A", "1"),
        ]);
        let mut read = Read::default();
        read.insert((Kind::Secret, "nowhere".into()), Object::Absent);
        read.insert((Kind::Secret, "creds".into()), found(&[("k", b"v")]));
        let msg = start_message(&pod, "uid", &read).unwrap().unwrap();
        assert_eq!(msg.env, [("A".to_string(), "1".to_string())]);
    }

    #[test]
    fn a_value_the_launcher_would_refuse_is_refused_before_the_claim() {
        let pod = cold(vec![secret_ref("BIG", "creds", "blob", false)]);
        let mut read = Read::default();
        let huge = vec![b'x'; crate::inpod::launch::MAX_START_BYTES];
        read.insert((Kind::Secret, "creds".into()), found(&[("blob", &huge)]));
        let err = start_message(&pod, "uid", &read).unwrap_err();
        assert!(matches!(err, Unresolved::Refused(_)), "{err}");
        assert!(err.to_string().len() < 1024, "no value in the reason");
        read.insert((Kind::Secret, "creds".into()), found(&[("blob", b"a\0b")]));
        let err = start_message(&pod, "uid", &read).unwrap_err();
        assert!(matches!(err, Unresolved::Refused(_)), "{err}");
        read.insert(
            (Kind::Secret, "creds".into()),
            found(&[("blob", &[0xff, 0xfe])]),
        );
        let err = start_message(&pod, "uid", &read).unwrap_err();
        assert!(matches!(err, Unresolved::NotText { .. }), "{err}");
    }

    #[test]
    fn a_field_ref_is_not_deliverable() {
        let from = EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                api_version: None,
            }),
            ..Default::default()
        };
        assert_eq!(deliverable(&from), None);
        let pod = cold(vec![EnvVar {
            name: "POD".into(),
            value: None,
            value_from: Some(from),
        }]);
        assert_eq!(
            start_message(&pod, "uid", &Read::default()),
            Err(Unresolved::Unsupported("POD".into()))
        );
    }
}
