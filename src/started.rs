//! What a run started with: its pod records, when it is created, the read-back spec its
//! teardown and checkpoints follow — the paths and their `sizeLimit`s, the drain timeout, the
//! compression and the store (`storeRef`) — and every stage that works on a run whose pod exists
//! sees that record in place of the live spec's ([`as_started`]). An author (or anyone who may
//! patch the run) who changes `spec.readBack` after the pod exists, with the webhook absent or
//! bypassed, can therefore neither drop a path from the drain (a loss that would look like a
//! path never declared), nor raise a cap or the drain timeout past what was admitted, nor send
//! the drain to another store (docs/contract.md "A teardown follows what its run started
//! with").
//!
//! The record is an environment variable of the holder container: a pod's containers and their
//! environment cannot be changed once it exists, so what the operator wrote at creation is what
//! it reads at teardown. `readBack.retention` is not recorded: what deleting a run does to its
//! files may change at any time (docs/contract.md "Update rules").

use k8s_openapi::api::core::v1::{EnvVar, Pod};

use crate::api::{NetworkPolicy, ReadBack, SandboxRun};

/// The holder container's variable that records the run's read-back spec at the pod's creation.
pub const STARTED_READBACK_ENV: &str = "SANDBOXRUN_STARTED_READBACK";

/// The holder container's variable that records the run's `spec.network` at the pod's creation:
/// the egress proxy judges a connection from the pod by it AND by the run's live rules, so an
/// edit of the run made after its pod exists can narrow its egress, never widen it
/// (docs/contract.md "A teardown follows what its run started with").
pub const STARTED_NETWORK_ENV: &str = "SANDBOXRUN_STARTED_NETWORK";

/// The largest record read back: 16 paths of at most 1,024 bytes, or 512 rules of a host name's
/// length, need less; a longer value (a pod the operator did not write) is not parsed.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// The variable that records `read_back` in a pod (None: the run declares no read-back spec).
pub(crate) fn record(read_back: Option<&ReadBack>) -> Option<EnvVar> {
    let mut recorded = read_back?.clone();
    recorded.retention = None;
    let value = serde_json::to_string(&recorded).ok()?;
    Some(EnvVar {
        name: STARTED_READBACK_ENV.to_string(),
        value: Some(value),
        value_from: None,
    })
}

/// The variable that records a restricted `network` in a pod (None: no `spec.network`, or mode
/// `open`: nothing to bound).
pub(crate) fn record_network(network: Option<&NetworkPolicy>) -> Option<EnvVar> {
    let network = network.filter(|n| n.mode != crate::api::NetworkMode::Open)?;
    Some(EnvVar {
        name: STARTED_NETWORK_ENV.to_string(),
        value: Some(serde_json::to_string(network).ok()?),
        value_from: None,
    })
}

/// The read-back spec `pod` recorded at its creation; None when it records none (a pod made by
/// a release before the record, or a run without read-back paths) or the record does not parse.
pub(crate) fn recorded(pod: &Pod) -> Option<ReadBack> {
    serde_json::from_str(holder_record(pod, STARTED_READBACK_ENV)?).ok()
}

/// The restricted `spec.network` `pod` recorded at its creation; None when it records none.
pub(crate) fn recorded_network(pod: &Pod) -> Option<NetworkPolicy> {
    serde_json::from_str(holder_record(pod, STARTED_NETWORK_ENV)?).ok()
}

/// The value of the holder's record `name`, when it is not longer than any record the operator
/// writes.
fn holder_record<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    let value = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .filter(|c| c.name == crate::names::HOLDER_CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == name)?
        .value
        .as_deref()?;
    (value.len() <= MAX_RECORD_BYTES).then_some(value)
}

/// `run` as it started: with `pod` (the run's own pod), its read-back spec is the one the pod
/// recorded, keeping the live `retention`; without a pod, or a pod that records none, `run` as
/// it is.
pub(crate) fn as_started(mut run: SandboxRun, pod: Option<&Pod>) -> SandboxRun {
    let Some(mut started) = pod.and_then(recorded) else {
        return run;
    };
    started.retention = run.spec.read_back.as_ref().and_then(|r| r.retention);
    run.spec.read_back = Some(started);
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Compression, ReadBackPath, Retention};
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn path(p: &str, limit: Option<&str>) -> ReadBackPath {
        ReadBackPath {
            path: p.to_string(),
            size_limit: limit.map(|l| Quantity(l.to_string())),
            ..Default::default()
        }
    }

    fn read_back(paths: Vec<ReadBackPath>, store: Option<&str>) -> ReadBack {
        ReadBack {
            paths,
            compression: Compression::default(),
            drain_timeout: Some("1m".into()),
            retention: Some(Retention::Retain),
            store_ref: store.map(str::to_string),
        }
    }

    fn run_with(rb: ReadBack) -> SandboxRun {
        crate::testkit::sandbox_run("r")
            .edit(|spec| spec.read_back = Some(rb))
            .build()
    }

    fn pod_recording(rb: &ReadBack) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: crate::pod::WORKLOAD_CONTAINER.into(),
                        ..Default::default()
                    },
                    Container {
                        name: crate::pod::HOLDER_CONTAINER.into(),
                        env: record(Some(rb)).map(|e| vec![e]),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_run_whose_read_back_spec_changed_after_its_pod_was_made_is_torn_down_as_it_started() {
        let started = read_back(vec![path("/out", Some("1Mi")), path("/logs", None)], None);
        let pod = pod_recording(&started);
        // Patched without the webhook: a path dropped, one added, the cap and timeout raised,
        // another store named, and retention changed (which may change).
        let mut patched = read_back(vec![path("/out", Some("100Gi")), path("/etc", None)], None);
        patched.drain_timeout = Some("10h".into());
        patched.store_ref = Some("someone-elses-store".into());
        patched.retention = Some(Retention::Delete);
        let run = run_with(patched);
        let as_started = as_started(run, Some(&pod));
        let rb = as_started.spec.read_back.expect("a read-back spec");
        assert_eq!(rb.paths, started.paths);
        assert_eq!(rb.drain_timeout.as_deref(), Some("1m"));
        assert_eq!(rb.store_ref, None);
        assert_eq!(
            rb.retention,
            Some(Retention::Delete),
            "retention may change at any time"
        );
    }

    #[test]
    fn without_a_pod_or_a_record_the_run_is_as_it_is() {
        let rb = read_back(vec![path("/out", None)], Some("store"));
        let run = run_with(rb.clone());
        assert_eq!(as_started(run.clone(), None).spec, run.spec);
        let mut old_pod = pod_recording(&rb);
        if let Some(spec) = old_pod.spec.as_mut() {
            spec.containers[1].env = None;
        }
        assert_eq!(as_started(run.clone(), Some(&old_pod)).spec, run.spec);
    }

    #[test]
    fn a_record_too_long_or_not_a_read_back_spec_is_not_read() {
        let rb = read_back(vec![path("/out", None)], None);
        let mut pod = pod_recording(&rb);
        let holder = &mut pod.spec.as_mut().expect("spec").containers[1];
        for value in [
            "x".repeat(MAX_RECORD_BYTES + 1),
            "{\"paths\": 7}".to_string(),
        ] {
            holder.env = Some(vec![EnvVar {
                name: STARTED_READBACK_ENV.into(),
                value: Some(value),
                value_from: None,
            }]);
            let probe = Pod {
                spec: Some(PodSpec {
                    containers: vec![holder.clone()],
                    ..Default::default()
                }),
                ..Default::default()
            };
            assert_eq!(recorded(&probe), None);
        }
    }

    #[test]
    fn no_read_back_spec_records_nothing() {
        assert_eq!(record(None), None);
    }

    #[test]
    fn a_restricted_network_is_recorded_and_read_back_and_an_open_one_is_not() {
        use crate::api::NetworkMode;
        let allow = NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: vec!["api.example.com:443".into()],
        };
        let env = record_network(Some(&allow)).expect("recorded");
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: crate::pod::HOLDER_CONTAINER.into(),
                    env: Some(vec![env]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(recorded_network(&pod), Some(allow));
        let open = NetworkPolicy {
            mode: NetworkMode::Open,
            rules: Vec::new(),
        };
        assert_eq!(record_network(Some(&open)), None);
        assert_eq!(record_network(None), None);
    }
}
