//! The I/O of a restore (docs/contract.md "Pause, resume and fork"), carried out by the act
//! stage ([`super::act`]) for the effects `RestoreWorkspace` and `DeliverStart`: each declared
//! path's manifest of the source attempt read from the store the run uses now (its keys computed
//! from the run's own namespace, name and uid: never a key the status or a manifest names), the
//! manifest checked to be that run's, that attempt's and that path's, the archive streamed checked
//! ([`crate::restore`]) into `restore-unpack` exec'd in the parked pod's holder; then the start
//! (or the refusal) handed to the launcher through `pods/attach` (the words and rules of it
//! [`super::launcher`]'s, the attach and the `launch-status` exec act's `Parked`, passed in).
//! What the answers mean is planned elsewhere (`plan::restore`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use kube::{Api, ResourceExt};
use tokio::io::AsyncReadExt;
use tracing::{debug, info, warn};

use super::launcher::Talk;
use super::plan::{bind_fork, Bound, Generation, NotHanded, NotRestored, RestoreSource};
use crate::api::{RestoreOutcome, RestoreStatus, SandboxRun};
use crate::controller::context::Context;
use crate::identity::RunId;
use crate::store::{attempt_object_keys, checkpoint_object_keys, read_manifest};

/// The longest a hand-over to the launcher may take (its status, then the attach), connections
/// included: past it the start is recorded undelivered and handed again later.
const DELIVER_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest one path's restore may take.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a restore failed, in words for the status.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("the run cannot be started after a restore: {0}")]
    NoCommand(String),
    #[error("the run's store cannot be used: {0}")]
    Store(String),
    #[error("{generation}'s manifest of {path} cannot be read: {why}")]
    Manifest {
        generation: Generation,
        path: String,
        why: String,
    },
    #[error(
        "the manifest at {0} is not the source run's, its attempt's or checkpoint's, or this path's"
    )]
    NotOurs(String),
    #[error("{path}: {why}")]
    Stream { path: String, why: String },
    #[error("exec restore-unpack for {path}: {why}")]
    Exec { path: String, why: String },
    #[error(
        "the launcher of pod {0} has already taken its one start: nothing is restored into it"
    )]
    Started(String),
    #[error("restoring {0} took longer than {RESTORE_TIMEOUT:?}")]
    Timeout(String),
    #[error("nothing is restored into it: {0}")]
    NotServed(#[from] crate::pod::SlotMismatch),
}

/// Restores every declared path of `run`'s current attempt, in its parked pod `pod_name`, from
/// the files of `from` (a fork's source is read once, here, and bound by [`bind_fork`]): what
/// it was bound to, and (files, bytes) or why not.
pub(super) async fn restore(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    (pod_name, talk): (&str, &impl Talk),
    from: &RestoreSource,
) -> (Bound, Result<(u64, u64), NotRestored>) {
    info!(run = %id.name, pod = pod_name, ?from, "restoring the read-back paths");
    let (bound, whose) = match bind_source(ctx, (run, id), from).await {
        Ok(bound) => bound,
        Err((bound, why)) => {
            warn!(run = %run.name_any(), %why, "the restore's source cannot be used");
            return (bound, Err(why));
        }
    };
    let done = restore_all(
        ctx,
        (run, id),
        (pod_name, talk),
        (&whose, bound.generation()),
    )
    .await;
    match &done {
        Ok((files, bytes)) => info!(run = %run.name_any(), files, bytes, "restored"),
        Err(why) => warn!(run = %run.name_any(), %why, "the restore failed"),
    }
    (bound, done.map_err(|e| NotRestored(e.to_string())))
}

/// Whether the live run already records its current attempt's restore. A reconcile's run comes
/// from the watch cache, which can lag behind this operator's own status write: a pod event
/// right after a restore was recorded and its start handed over reconciled the old copy, restored
/// again into the started pod, and recorded that second restore's refusal over the first one's
/// success (`bench/pause_resume.sh`, a warm resume). Read live, the record is there: nothing is
/// restored twice. A read that fails answers false (the restore's own checks then decide).
pub(super) async fn already_recorded(ctx: &Context, (run, id): (&SandboxRun, &RunId)) -> bool {
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &id.namespace);
    let Ok(live) = runs.get(&id.name).await else {
        return false;
    };
    crate::controller::run::plan::restore_recorded(&live, run)
}

/// Whose files `from` are: what the restore is bound to, and the run whose keys and manifests
/// are read. A fork's source is read now (the only read of it) and judged by [`bind_fork`].
async fn bind_source(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    from: &RestoreSource,
) -> Result<(Bound, RunId), (Bound, NotRestored)> {
    let asked = match from {
        RestoreSource::Own(attempt) => return Ok((Bound::own(*attempt), id.clone())),
        RestoreSource::Fork(asked) => asked,
    };
    let unbound = Bound {
        run: Some(asked.run.clone()),
        uid: asked.uid.clone(),
        attempt: asked.attempt.unwrap_or(0),
        checkpoint: asked.checkpoint,
    };
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &id.namespace);
    let source = match runs.get_opt(&asked.run).await {
        Ok(source) => source,
        Err(e) => {
            let why = NotRestored(format!("the source run {} cannot be read: {e}", asked.run));
            return Err((unbound, why));
        }
    };
    match bind_fork(run, source.as_ref(), asked) {
        Ok((whose, generation)) => {
            let (attempt, checkpoint) = generation.parts();
            let bound = Bound {
                run: Some(whose.name.clone()),
                uid: Some(whose.uid.clone()),
                attempt,
                checkpoint,
            };
            Ok((bound, whose))
        }
        Err(why) => Err((unbound, why.into())),
    }
}

async fn restore_all(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    (pod_name, talk): (&str, &impl Talk),
    (whose, from): (&RunId, Generation),
) -> Result<(u64, u64), Failed> {
    // A run the launcher cannot start (no command) is refused before anything is restored.
    let built =
        crate::pod::build_pod(run, &ctx.pod).map_err(|e| Failed::NoCommand(e.to_string()))?;
    if crate::pool::pod::start_message(&built, "").is_none() {
        return Err(Failed::NoCommand(
            "spec.command is not set: the launcher starts only a command the run names".into(),
        ));
    }
    let store = ctx
        .run_store((&id.namespace, run))
        .await
        .map_err(|e| Failed::Store(e.to_string()))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &id.namespace);
    let pod = pods.get(pod_name).await.map_err(|e| Failed::Exec {
        path: pod_name.to_string(),
        why: e.to_string(),
    })?;
    let paths = run.spec.read_back.as_ref().map(|r| r.paths.clone());
    let (mut files, mut bytes) = (0, 0);
    for (index, declared) in paths.unwrap_or_default().iter().enumerate() {
        let keys = generation_keys(&store.prefix, whose, from, index, &declared.path);
        let manifest = read_manifest(&store.store, &keys.manifest)
            .await
            .map_err(|e| Failed::Manifest {
                generation: from,
                path: declared.path.clone(),
                why: e.to_string(),
            })?;
        if !super::plan::manifest_is(&manifest, whose, from, (index, &declared.path)) {
            return Err(Failed::NotOurs(keys.manifest.to_string()));
        }
        if index == 0 {
            launcher_waits(talk, pod_name).await?;
        }
        let requested = declared
            .size_limit
            .as_ref()
            .and_then(|q| crate::units::quantity_to_bytes(q).ok());
        let cap = ctx.caps.effective(requested);
        // Restored only where the pod serves the path's slot (docs/contract.md "A read-back slot
        // is made once").
        let slot = crate::pod::ReadBackSlot::read(&pod, index, &declared.path)?;
        let one = restore_one(
            ctx,
            (&pods, pod_name),
            (&store.store, manifest),
            &slot.holder_mount,
            cap,
        );
        let (f, b) = tokio::time::timeout(RESTORE_TIMEOUT, one)
            .await
            .map_err(|_| Failed::Timeout(declared.path.clone()))??;
        files += f;
        bytes += b;
    }
    Ok((files, bytes))
}

/// The keys of the `index`-th declared path in `whose`'s generation `from`: computed from the
/// run's own namespace, name and uid, never a key the status or a manifest names.
fn generation_keys(
    prefix: &object_store::path::Path,
    whose: &RunId,
    from: Generation,
    index: usize,
    path: &str,
) -> crate::store::ObjectKeys {
    let none = crate::api::Compression::None;
    match from {
        Generation::Attempt(attempt) => {
            attempt_object_keys(prefix, whose, attempt, index, path, none)
        }
        Generation::Checkpoint { checkpoint, .. } => {
            checkpoint_object_keys(prefix, whose, checkpoint, index, path, none)
        }
    }
}

/// Never a restore into a pod whose one start is spent (one run per pod: a warm pool's pod
/// someone attached to before the claim, issue #54): its launcher must still wait.
async fn launcher_waits(talk: &impl Talk, pod_name: &str) -> Result<(), Failed> {
    match super::launcher::still_waiting(talk, pod_name).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Failed::Started(pod_name.to_string())),
        Err(e) => Err(Failed::Exec {
            path: pod_name.to_string(),
            why: e.to_string(),
        }),
    }
}

/// The pipe between the restore's stream and the exec's stdin.
const STDIN_BUFFER: usize = 256 * 1024;

/// One path: `restore-unpack` exec'd in the holder, the checked stream written to its stdin,
/// its exit awaited; (files, bytes).
async fn restore_one(
    ctx: &Context,
    (pods, pod_name): (&Api<Pod>, &str),
    (store, mut manifest): (
        &std::sync::Arc<dyn object_store::ObjectStore>,
        crate::store::Manifest,
    ),
    holder_path: &str,
    cap: u64,
) -> Result<(u64, u64), Failed> {
    let path = manifest.declared_path.clone();
    // The cap is the run's, never what a manifest claims.
    manifest.cap_bytes = manifest.cap_bytes.min(cap);
    let exec = |why: String| Failed::Exec {
        path: path.clone(),
        why,
    };
    let argv = vec![
        ctx.pod.holder_binary.clone(),
        "restore-unpack".to_string(),
        holder_path.to_string(),
        "--budget".to_string(),
        manifest.cap_bytes.to_string(),
    ];
    debug!(pod = pod_name, ?argv, "exec restore-unpack");
    let mut params = AttachParams::default()
        .container(crate::names::HOLDER_CONTAINER)
        .stdin(true)
        .stdout(false)
        .stderr(true);
    // kube's default stdin pipe holds 1 KiB, so each websocket message carried 1 KiB: a 64 MiB
    // restore ran at ~20 MB/s (docs/performance.md "Pause and resume"). Messages now carry what
    // kube's reader takes at once (4 KiB).
    params.max_stdin_buf_size = Some(STDIN_BUFFER);
    let mut process = pods
        .exec(pod_name, argv, &params)
        .await
        .map_err(|e| exec(e.to_string()))?;
    let mut stdin = process.stdin().ok_or_else(|| exec("no stdin".into()))?;
    let stderr = process.stderr();
    let status = process.take_status();
    let errors = tokio::spawn(async move {
        let mut said = String::new();
        if let Some(mut s) = stderr {
            let _ = (&mut s).take(4096).read_to_string(&mut said).await;
        }
        said
    });
    let streamed = crate::restore::restore_path(store, &manifest, &mut stdin).await;
    let carried = match streamed {
        Ok(carried) => carried,
        Err(e) => {
            // Never the end of the archive: the unpacker fails, the start is never handed over.
            process.abort();
            return Err(Failed::Stream {
                path,
                why: e.to_string(),
            });
        }
    };
    debug!(pod = pod_name, path = %path, files = carried.files, "streamed; awaiting restore-unpack");
    // The end of the archive ends the unpack: stdin stays open until it exits (a close can
    // overtake data in flight on this apiserver, see `crate::plugin::session::write_argv`).
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    drop(stdin);
    let said = errors.await.unwrap_or_default();
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => Ok((carried.files, carried.bytes)),
        Some(s) => Err(exec(format!(
            "{} {}",
            s.message.unwrap_or_default(),
            said.trim()
        ))),
        None => Err(exec(format!("ended without a status {}", said.trim()))),
    }
}

/// The run's start for its parked pod `pod_name`. A pod parked for a restore carries the run's
/// env (the kubelet resolved its Secret and ConfigMap keys): its plain values are handed over. A
/// warm pool's pod (`status.warmStart.pod`) carries the template's only: each value of a Secret's
/// or ConfigMap's key is read now, in the run's namespace (`crate::pool::env`, issue #54), and
/// one that cannot be delivered is the start refused, named without its value.
async fn start_of(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    pod_name: &str,
) -> Result<crate::inpod::launch::StartMessage, NotHanded> {
    let uid = &id.uid;
    let built = crate::pod::build_pod(run, &ctx.pod).map_err(|e| NotHanded(e.to_string()))?;
    let no_command = || NotHanded("the run has no command for the launcher to start".into());
    let attempt = crate::identity::current_attempt(run);
    let warm = run
        .status
        .as_ref()
        .and_then(|s| s.warm_start.as_ref())
        .filter(|w| w.attempt() == attempt)
        .is_some_and(|w| w.pod.as_deref() == Some(pod_name));
    let base = crate::pool::pod::start_message(&built, uid).ok_or_else(no_command)?;
    if !warm {
        return Ok(base);
    }
    let sources = crate::pool::env::sources(&built);
    let read = super::env_sources::read(ctx, &id.namespace, &sources)
        .await
        .map_err(|e| NotHanded(e.to_string()))?;
    Ok(crate::pool::env::with_env(base, &built, &read)
        .unwrap_or_else(|why| crate::inpod::launch::StartMessage::refusal(uid, &why.to_string())))
}

/// Hands the parked launcher of `pod_name` the run's start, or — `record` says the restore
/// failed — a refusal that names why (the launcher exits 127 and the workload never runs).
pub(super) async fn deliver(
    ctx: &Context,
    (run, id): (&SandboxRun, &RunId),
    (pod_name, talk): (&str, &impl Talk),
    record: &RestoreStatus,
) -> Result<(), NotHanded> {
    let mut message = start_of(ctx, (run, id), pod_name).await;
    if record.outcome == RestoreOutcome::Failed {
        let why = record.message.clone().unwrap_or_default();
        message = Ok(crate::inpod::launch::StartMessage::refusal(&id.uid, &why));
    }
    let message = message?;
    info!(run = %id.name, pod = pod_name, refused = message.refuse.is_some(), "handing the launcher its start");
    let handing = super::launcher::deliver_if_waiting(talk, pod_name, &message);
    match tokio::time::timeout(DELIVER_TIMEOUT, handing).await {
        Ok(handed) => handed.map_err(|e| NotHanded(e.to_string())),
        Err(_) => Err(NotHanded(format!(
            "the launcher did not answer within {DELIVER_TIMEOUT:?}"
        ))),
    }
}
