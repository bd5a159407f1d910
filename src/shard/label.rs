//! The shard label of new runs (docs/contract.md "Shards"): a sharded replica's run watch
//! selects on `sandbox.iterion.io/shard`, so a run created without it would be seen by no
//! replica. Every replica watches the runs that have no such label, or one that is not
//! canonical ([`super::canonical_label`]: a tenant may write its runs' labels; only the runs
//! just created, created before sharding, or relabelled: the label takes them out of this
//! watch) and labels those of the shards it owns, again whenever it acquires a shard. The value is the shard of the run's uid
//! ([`super::shard_of`]), so whoever writes it writes the same, and it is never changed
//! ([`super::shard_of_run`]: a written label stays the run's shard). The watch is of the runs'
//! metadata only: every replica holds this backlog (a burst of creates before they are
//! labelled), so it holds their names, uids and labels, not their specs.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use tracing::warn;

use super::gate::ShardGate;
use super::SHARD_LABEL;
use crate::api::SandboxRun;

/// Labels, until the stream of runs ends, the runs of `api` without a shard label whose shard
/// `gate` owns.
pub(crate) async fn label_new_runs(api: Api<SandboxRun>, gate: Arc<ShardGate>) {
    let (reader, writer) = reflector::store();
    // The runs without the label, or with one that is not canonical (a tenant may write its
    // runs' labels): a value the watches would not match is written back.
    let config = watcher::Config::default().labels(&super::uncanonical_selector(gate.shards()));
    // The same scope as `api`, metadata-only requests (kube asks for PartialObjectMetadata).
    let client = api.clone().into_client();
    let metadata: Api<PartialObjectMeta<SandboxRun>> = match api.namespace() {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    // Backed off: a watch that keeps failing (the CRD not installed yet, the list forbidden, the
    // apiserver away) is retried like client-go's, never in a loop of LISTs.
    let mut unlabelled = std::pin::pin!(watcher(metadata, config)
        .default_backoff()
        .modify(|run| run.metadata.managed_fields = None)
        .reflect(writer)
        .applied_objects());
    let mut acquisitions = gate.acquisitions();
    loop {
        tokio::select! {
            run = unlabelled.next() => match run {
                Some(Ok(run)) => label(&api, &gate, &run.metadata).await,
                Some(Err(e)) => warn!(error = %e, "the watch of unlabelled runs failed; retried with back-off"),
                None => return,
            },
            changed = acquisitions.changed() => {
                if changed.is_err() {
                    return;
                }
                for run in reader.state() {
                    label(&api, &gate, &run.metadata).await;
                }
            }
        }
    }
}

/// The label a run of metadata `run` is to get (a small controller of its own: the watch above
/// observes, [`labelling`] decides, [`label`] acts).
#[derive(Debug, PartialEq, Eq)]
struct Labelling<'a> {
    namespace: &'a str,
    name: &'a str,
    shard: u32,
}

/// What to write on the run of metadata `run` among `shards` shards (pure): its uid's shard
/// when its label is missing or not canonical; None when it is labelled, or has no name,
/// namespace or uid.
fn labelling(run: &ObjectMeta, shards: u32) -> Option<Labelling<'_>> {
    let labelled = run
        .labels
        .as_ref()
        .and_then(|l| l.get(SHARD_LABEL))
        .is_some_and(|v| super::canonical_label(v, shards).is_some());
    if labelled {
        return None;
    }
    let shard = super::shard_of(run.uid.as_deref()?, shards);
    Some(Labelling {
        namespace: run.namespace.as_deref()?,
        name: run.name.as_deref()?,
        shard,
    })
}

/// Labels the run of metadata `run` with its shard when this replica owns that shard.
async fn label(api: &Api<SandboxRun>, gate: &Arc<ShardGate>, run: &ObjectMeta) {
    let Some(to) = labelling(run, gate.shards()) else {
        return;
    };
    if gate.enter(to.shard).is_none() {
        return;
    }
    let patch = serde_json::json!({"metadata": {"labels": {SHARD_LABEL: to.shard.to_string()}}});
    let api = Api::<SandboxRun>::namespaced(api.clone().into_client(), to.namespace);
    if let Err(e) = api
        .patch(to.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        warn!(run = %to.name, namespace = %to.namespace, error = %e, "labelling the run with its shard failed");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http::{Request, Response};
    use kube::client::Body;
    use kube::Client;

    use super::*;

    #[test]
    fn a_run_gets_its_uids_shard_when_its_label_is_missing_or_not_canonical_and_only_then() {
        let meta = |label: Option<&str>| ObjectMeta {
            name: Some("r".into()),
            namespace: Some("team".into()),
            uid: Some("5f0c0c8e-uid".into()),
            labels: label.map(|v| [(SHARD_LABEL.to_string(), v.to_string())].into()),
            ..Default::default()
        };
        let own = super::super::shard_of("5f0c0c8e-uid", 4);
        let expected = Labelling {
            namespace: "team",
            name: "r",
            shard: own,
        };
        assert_eq!(labelling(&meta(None), 4), Some(expected));
        // A tenant's relabel to a value no watch selects: the uid's shard is written back.
        for forged in ["011", "+1", " 1", "9"] {
            assert_eq!(
                labelling(&meta(Some(forged)), 4).map(|l| l.shard),
                Some(own),
                "{forged}"
            );
        }
        // Canonical: left as it is (a written label stays the run's shard).
        let other = (own + 1) % 4;
        assert_eq!(labelling(&meta(Some(&other.to_string())), 4), None);
        let mut nameless = meta(None);
        nameless.uid = None;
        assert_eq!(labelling(&nameless, 4), None);
    }

    /// A watch of the unlabelled runs that keeps failing (here every LIST answered 404, as before
    /// the CRD is installed) is retried with back-off. Without it the labeller re-listed as fast
    /// as the apiserver answered: on the bed, a replica started before its CRD spent 26–70 % of
    /// a core on LISTs of a resource that did not exist (1 % with the back-off).
    #[tokio::test]
    async fn a_failing_watch_of_unlabelled_runs_is_retried_with_back_off() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let lists = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&lists);
        tokio::spawn(async move {
            while let Some((_, send)) = handle.next_request().await {
                counted.fetch_add(1, Ordering::SeqCst);
                send.send_response(
                    Response::builder()
                        .status(404)
                        .body(Body::from(b"404 page not found".to_vec()))
                        .unwrap(),
                );
            }
        });
        let api: Api<SandboxRun> = Api::namespaced(Client::new(service, "ns"), "ns");
        let labeller = tokio::spawn(label_new_runs(api, ShardGate::new(4)));
        tokio::time::sleep(Duration::from_secs(2)).await;
        labeller.abort();
        let n = lists.load(Ordering::SeqCst);
        // client-go's back-off: 0.8 s, then doubling (with jitter): two or three in 2 s.
        assert!((1..=4).contains(&n), "{n} LISTs in 2 s");
    }
}
