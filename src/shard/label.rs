//! The shard label of new runs (docs/contract.md "Shards"): a sharded replica's run watch
//! selects on `sandbox.iterion.io/shard`, so a run created without it would be seen by no
//! replica. Every replica watches the runs that have no such label (only the ones just created,
//! or created before sharding: the label takes them out of this watch) and labels those of the
//! shards it owns, again whenever it acquires a shard. The value is the shard of the run's uid
//! ([`super::shard_of`]), so whoever writes it writes the same, and it is never changed
//! ([`super::shard_of_run`]: a written label stays the run's shard).

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use tracing::{debug, warn};

use super::gate::ShardGate;
use super::SHARD_LABEL;
use crate::api::SandboxRun;

/// Labels, until the stream of runs ends, the runs of `api` without a shard label whose shard
/// `gate` owns.
pub(crate) async fn label_new_runs(api: Api<SandboxRun>, gate: Arc<ShardGate>) {
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("!{SHARD_LABEL}"));
    let mut unlabelled = std::pin::pin!(watcher(api.clone(), config)
        .reflect(writer)
        .applied_objects());
    let mut acquisitions = gate.acquisitions();
    loop {
        tokio::select! {
            run = unlabelled.next() => match run {
                Some(Ok(run)) => label(&api, &gate, &run).await,
                Some(Err(e)) => debug!(error = %e, "the watch of unlabelled runs restarts"),
                None => return,
            },
            changed = acquisitions.changed() => {
                if changed.is_err() {
                    return;
                }
                for run in reader.state() {
                    label(&api, &gate, &run).await;
                }
            }
        }
    }
}

/// Labels `run` with its shard when this replica owns that shard.
async fn label(api: &Api<SandboxRun>, gate: &Arc<ShardGate>, run: &SandboxRun) {
    let Some(shard) = gate.shard_of(run) else {
        return;
    };
    if run.labels().contains_key(SHARD_LABEL) || gate.enter(shard).is_none() {
        return;
    }
    let Some(namespace) = run.namespace() else {
        return;
    };
    let patch = serde_json::json!({"metadata": {"labels": {SHARD_LABEL: shard.to_string()}}});
    let api = Api::<SandboxRun>::namespaced(api.clone().into_client(), &namespace);
    if let Err(e) = api
        .patch(
            &run.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        warn!(run = %run.name_any(), %namespace, error = %e, "labelling the run with its shard failed");
    }
}
