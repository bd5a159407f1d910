//! One declared path's drain, end to end: exec `pack` in the holder, stream its tar through the
//! pipeline into the store, and commit — retrying transient failures with backoff until the run's
//! drain deadline. The outcome is always a status entry: a failure is reported as Failed with its
//! cause, never as an empty set (ADR-143 §4).
//!
//! Commit order matters: the archive is uploaded, THEN the exec status is checked, THEN the
//! manifest is written create-only. A packer that exited non-zero (or a stream that lost its
//! status) never gets a manifest, so no reader can mistake a partial archive for a result. The one
//! exception is a stream that reached the drain's input bound: the drain stopped reading on
//! purpose, so the packer is stopped too and the members read whole are committed as `Capped`
//! (see `archive.rs`).
//!
//! The packer gets the path's cap as `--budget` so that members over it never cross the wire.
//! Backward compatibility: a holder image that predates the flag (pods created before an upgrade
//! keep their image) fails with a usage error that names it; the drain then retries at once
//! without the flag, for that path, and meters the full stream as before.
//!
//! A path where nothing could be read is not an empty set: when the packer reported unreadable
//! entries and stored no file, the path fails with the packer's notes ([`nothing_readable`]).

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::archive::{drain_stream, DrainError, DrainErrorKind, DrainOptions};
use super::attempt_error::describe_failure;
pub(crate) use super::attempt_error::AttemptError;
use super::bandwidth::DrainBandwidth;
use super::exec::{pack_argv, ExecError, PackExec, BUDGET_FLAG};
use super::idle::IdleGuard;
use super::outcome::failed;
pub(crate) use super::outcome::{committed_status, nothing_readable, store_unusable};
use super::pod_notes::pod_notes;
use super::wire::{Wire, WIRE_FLAG};
use crate::api::{Compression, ReadBackStatus};
use crate::identity::RunId;
use crate::metrics::Metrics;
use crate::store::credentials;
use crate::store::manifest::WireRecord;
use crate::store::{
    archive_writer, attempt_object_keys, checkpoint_object_keys, try_read_manifest, write_manifest,
    DrainOutcome, Manifest, ManifestContext, ManifestWrite, ObjectKeys, StoreError,
};

/// Longest pause between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// Everything one path's drain needs, by concern (docs/contract.md §3).
pub(crate) struct PathJob<'a> {
    /// Where the path is read from: the run's pod and its packer.
    pub(crate) pod: PodSource<'a>,
    /// Where its archive and manifest go.
    pub(crate) store: StoreTarget<'a>,
    /// Whose files these are (their keys' directory, the manifest's `run`).
    pub(crate) run: &'a RunId,
    /// Which of the run's generations: its attempt, or a checkpoint.
    pub(crate) generation: JobGeneration,
    /// The declared path, where the holder mounts it, its cap.
    pub(crate) path: PathSpec<'a>,
    /// How it crosses the wire and how long it may take.
    pub(crate) limits: DrainLimits<'a>,
    /// What stops it and what it counts.
    pub(crate) control: DrainControl<'a>,
}

/// Where a path is read from.
pub(crate) struct PodSource<'a> {
    /// Pods of the run's namespace.
    pub(crate) pods: &'a Api<Pod>,
    /// The run's pod.
    pub(crate) name: &'a str,
    /// argv of the packer (the path is appended).
    pub(crate) pack_command: &'a [String],
}

/// Where a path's archive and manifest go.
pub(crate) struct StoreTarget<'a> {
    /// The store.
    pub(crate) objects: &'a Arc<dyn ObjectStore>,
    /// Aborts the archive key's open multipart uploads before each attempt (None: not S3).
    pub(crate) open_uploads: Option<&'a crate::store::open_uploads::OpenUploads>,
    /// Key prefix in the store.
    pub(crate) prefix: &'a object_store::path::Path,
    /// Store URL (to render object URLs).
    pub(crate) url: &'a str,
    /// The tenant store's ConfigMap (`namespace/name`); None: the operator's store. A refusal
    /// of the credentials names whose they are.
    pub(crate) tenant: Option<&'a str>,
}

/// Which generation of the run's files a drain writes (its keys and its manifest).
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobGeneration {
    /// The run's attempt whose files these are (`spec.retryPolicy`).
    pub(crate) attempt: u32,
    /// The checkpoint being taken (`spec.checkpoint`), None at a teardown.
    pub(crate) checkpoint: Option<u32>,
}

/// One declared path.
pub(crate) struct PathSpec<'a> {
    /// Position of the path in spec.readBack.paths.
    pub(crate) index: usize,
    /// The declared container path.
    pub(crate) declared: &'a str,
    /// Where the holder mounts it: the packer's argument (docs/contract.md "The holder runs only
    /// the operator's code").
    pub(crate) holder_path: &'a str,
    /// Effective cap.
    pub(crate) cap_bytes: u64,
    /// Attempts already made (recorded in status by an earlier operator).
    pub(crate) previous_attempts: u32,
}

/// How a path crosses the wire, and by when.
pub(crate) struct DrainLimits<'a> {
    /// Compression.
    pub(crate) compression: Compression,
    /// How the packer is asked to send its tar (`pack --wire`).
    pub(crate) wire: Wire,
    /// Per-path idle bound (`run --drain-idle-timeout`, src/drain/idle.rs).
    pub(crate) idle: Duration,
    /// The replica's drain bandwidth, shared by all its drains (`run
    /// --max-drain-bytes-per-second`, src/drain/bandwidth.rs).
    pub(crate) bandwidth: &'a DrainBandwidth,
    /// When the run's drain timeout ends.
    pub(crate) deadline: tokio::time::Instant,
}

/// What stops a drain, and what it counts.
pub(crate) struct DrainControl<'a> {
    /// Metrics.
    pub(crate) metrics: &'a Metrics,
    /// Cancelled when this replica must stop draining at once (its lease is lost, or it shuts
    /// down): the attempt in flight is dropped (its upload aborts itself) and nothing is recorded,
    /// so the next leader resumes the path.
    pub(crate) cancel: &'a CancellationToken,
    /// Asked right before the manifest is committed (None: nothing to ask): a drain whose fence
    /// says no commits nothing and records nothing (src/drain/fence.rs).
    pub(crate) fence: Option<&'a super::Fence>,
}

/// What the store says about a path's commit point before an attempt uploads anything.
#[derive(Debug)]
enum CommitCheck {
    /// A manifest is there: the path is committed, and its archive must not be touched.
    Committed(Box<Manifest>),
    /// No manifest: an attempt may upload.
    Open,
}

/// Reads the commit point until the store answers (docs/contract.md: a committed archive is never
/// overwritten). A read ERROR is not "not committed": it is retried with backoff, never followed
/// by an upload; at the deadline, or when cancelled, the last error is returned.
async fn check_commit(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    backoff: &mut Duration,
) -> Result<CommitCheck, StoreError> {
    loop {
        let error = match try_read_manifest(job.store.objects, &keys.manifest).await {
            Ok(Some(m)) => return Ok(CommitCheck::Committed(Box::new(m))),
            Ok(None) => return Ok(CommitCheck::Open),
            Err(e) => e,
        };
        // Refused credentials, or an oversized object at the manifest key, do not heal by
        // retrying: fail at once, naming the settings or the object.
        if error.is_permanent() {
            return Err(error);
        }
        warn!(path = job.path.declared, manifest = %keys.manifest, error = %error, "cannot read the manifest; not uploading until the store answers");
        job.control
            .metrics
            .drain_failures
            .with_label_values(&["store"])
            .inc();
        let left = job
            .limits
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(error);
        }
        tokio::select! {
            () = job.control.cancel.cancelled() => return Err(error),
            () = tokio::time::sleep((*backoff).min(left)) => {}
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }
}

/// Drains one path; never returns an error — a failure is a Failed entry with its cause. None
/// when [`DrainControl::cancel`] fired: nothing is recorded, the path stays Pending for the next
/// leader.
pub(crate) async fn drain_path(job: &PathJob<'_>) -> Option<ReadBackStatus> {
    let mut drain = PathDrain::new(job);
    loop {
        if job.control.cancel.is_cancelled() {
            info!(
                path = job.path.declared,
                "drain cancelled; leaving the path to the next leader"
            );
            return None;
        }
        // Before every attempt: is the path committed (by an earlier operator that died before
        // recording it, or by our own last attempt whose manifest PUT lost its response)?
        if let ControlFlow::Break(end) = drain.check_commit().await {
            return end;
        }
        let remaining = match drain.remaining() {
            ControlFlow::Continue(remaining) => remaining,
            ControlFlow::Break(timed_out) => return timed_out,
        };
        // No orphaned multipart uploads (docs/contract.md): an upload of this key left open by an
        // attempt whose process was killed (no drop guard ran) is aborted before a new one starts.
        let clean = crate::store::open_uploads::before_attempt(
            job.store.open_uploads,
            &drain.keys.archive,
            remaining.min(crate::store::open_uploads::BUDGET),
        );
        tokio::select! {
            () = job.control.cancel.cancelled() => return None,
            _ = clean => {}
        }
        drain.attempts += 1;
        info!(run = %job.run.name, namespace = %job.run.namespace, path = %job.path.declared, attempt = drain.attempts, "drain attempt started");
        let ctx = ManifestContext {
            run: drain.run.clone(),
            declared_path: job.path.declared.to_string(),
            index: job.path.index,
            attempt: drain.attempts,
        };
        let run_attempt = tokio::time::timeout(
            remaining,
            attempt(
                job,
                &drain.keys,
                &drain.opts,
                ctx,
                (drain.budget, drain.wire),
                &mut drain.last_written,
            ),
        );
        let result = tokio::select! {
            // Dropping the attempt drops its upload, which aborts itself (src/store/upload_guard.rs).
            () = job.control.cancel.cancelled() => {
                info!(path = job.path.declared, attempt = drain.attempts, "drain cancelled mid-attempt; leaving the path to the next leader");
                return None;
            }
            result = run_attempt => result,
        };
        if let ControlFlow::Break(end) = drain.after_attempt(result).await {
            return end;
        }
    }
}

/// One path's drain in progress: what carries over from one attempt to the next.
struct PathDrain<'j, 'a> {
    job: &'j PathJob<'a>,
    run: RunId,
    keys: ObjectKeys,
    opts: DrainOptions,
    started: Instant,
    attempts: u32,
    backoff: Duration,
    last_error: Option<AttemptError>,
    /// The path's cap, for the packer (`pack --budget`); dropped for good when the holder's
    /// packer predates the flag.
    budget: Option<u64>,
    /// The encoding asked of the packer; plain tar for good when the holder's packer predates
    /// `--wire`.
    wire: Wire,
    /// The manifest this replica last tried to write: a PUT that failed on the wire may still
    /// have committed, and the next check tells it apart from someone else's commit.
    /// Its digest only: not a second copy of its records (docs/contract.md "Drain memory").
    last_written: Option<[u8; 32]>,
    /// Whether an idle cut-off was retried already ([`AttemptError::retried`]).
    idle_retried: bool,
}

/// What one step of a drain says: go on (`Continue`), or the drain ends with this entry (None:
/// cancelled, nothing recorded).
type Next = ControlFlow<Option<ReadBackStatus>>;

impl<'j, 'a> PathDrain<'j, 'a> {
    fn new(job: &'j PathJob<'a>) -> Self {
        let run = job.run.clone();
        let keys = match job.generation.checkpoint {
            Some(n) => checkpoint_object_keys(
                job.store.prefix,
                &run,
                n,
                job.path.index,
                job.path.declared,
                job.limits.compression,
            ),
            None => attempt_object_keys(
                job.store.prefix,
                &run,
                job.generation.attempt,
                job.path.index,
                job.path.declared,
                job.limits.compression,
            ),
        };
        PathDrain {
            job,
            run,
            keys,
            opts: DrainOptions::new(job.path.cap_bytes, job.limits.compression),
            started: Instant::now(),
            attempts: job.path.previous_attempts,
            backoff: Duration::from_secs(1),
            last_error: None,
            budget: Some(job.path.cap_bytes),
            wire: job.limits.wire,
            last_written: None,
            idle_retried: false,
        }
    }

    /// The drain ends with `status`, counted in the metrics.
    fn end(&self, status: ReadBackStatus, failure: Option<&str>) -> Next {
        ControlFlow::Break(Some(finish(self.job, status, self.started, failure)))
    }

    /// The drain ends Failed with `message`.
    fn fail(&self, message: String, failure: &str) -> Next {
        self.end(
            failed(self.job.path.declared, self.attempts, message),
            Some(failure),
        )
    }

    /// "; last error: …", or nothing before the first failed attempt.
    fn last_cause(&self) -> String {
        self.last_error
            .as_ref()
            .map(|e| {
                format!(
                    "; last error: {}",
                    describe_failure(e, self.job.store.url, self.job.store.tenant)
                )
            })
            .unwrap_or_default()
    }

    /// The commit point before an attempt: already committed ends the drain with it; an
    /// unreadable one ends it Failed (never an upload over it).
    async fn check_commit(&mut self) -> Next {
        let job = self.job;
        match check_commit(job, &self.keys, &mut self.backoff).await {
            Ok(CommitCheck::Committed(manifest)) => {
                let ours = self
                    .last_written
                    .is_some_and(|mine| mine == manifest.content_digest());
                info!(path = job.path.declared, manifest = %self.keys.manifest, committed_by_attempt = manifest.attempt, ours, "already committed; recording it");
                let status =
                    committed_status(job.path.declared, &manifest, &self.keys, job.store.url, self.attempts);
                self.end(status, None)
            }
            Ok(CommitCheck::Open) => ControlFlow::Continue(()),
            Err(_) if job.control.cancel.is_cancelled() => {
                info!(
                    path = job.path.declared,
                    "drain cancelled; leaving the path to the next leader"
                );
                ControlFlow::Break(None)
            }
            Err(e) if e.is_refused() => self.fail(
                credentials::refused_message(job.store.url, job.store.tenant, &e.to_string()),
                "store_credentials",
            ),
            Err(e @ StoreError::ManifestTooLarge { .. }) => self.fail(
                format!("the path was not drained: {e}; nothing was uploaded over it"),
                "manifest_too_large",
            ),
            Err(e) => self.fail(
                format!(
                    "drain timeout reached before the path was drained; the manifest (the commit point) could not be read, so nothing was uploaded over it: {e}"
                ),
                "timeout",
            ),
        }
    }

    /// The time left before the drain deadline, or the Failed entry of a drain that ran out.
    fn remaining(&self) -> ControlFlow<Option<ReadBackStatus>, Duration> {
        let remaining = self
            .job
            .limits
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        if !remaining.is_zero() {
            return ControlFlow::Continue(remaining);
        }
        let message = format!(
            "drain timeout reached before the path was drained{}",
            self.last_cause()
        );
        let status = failed(self.job.path.declared, self.attempts, message);
        ControlFlow::Break(Some(finish(
            self.job,
            status,
            self.started,
            Some("timeout"),
        )))
    }

    /// What an attempt's result means: committed, retried (at once with fewer flags for an
    /// older packer, after a backoff when transient), or failed for good.
    async fn after_attempt(
        &mut self,
        result: Result<Result<Manifest, AttemptError>, tokio::time::error::Elapsed>,
    ) -> Next {
        let job = self.job;
        let attempts = self.attempts;
        match result {
            Ok(Ok(manifest)) => {
                let status = committed_status(
                    job.path.declared,
                    &manifest,
                    &self.keys,
                    job.store.url,
                    attempts,
                );
                self.end(status, None)
            }
            Ok(Err(AttemptError::Exec(e)))
                if self.wire != Wire::Tar && e.refuses_flag(WIRE_FLAG) =>
            {
                let older = self.wire.older().unwrap_or_default();
                warn!(
                    path = job.path.declared,
                    attempt = attempts,
                    error = %e,
                    refused = self.wire.as_str(),
                    next = older.as_str(),
                    "the holder's packer does not know --wire {} (an older holder image?); retrying with --wire {}",
                    self.wire.as_str(),
                    older.as_str()
                );
                self.wire = older;
                self.last_error = Some(AttemptError::Exec(e));
                ControlFlow::Continue(())
            }
            Ok(Err(AttemptError::Exec(e)))
                if self.budget.is_some() && e.refuses_flag(BUDGET_FLAG) =>
            {
                warn!(
                    path = job.path.declared,
                    attempt = attempts,
                    error = %e,
                    "the holder's packer does not know --budget (an older holder image?); retrying without it, so members over the cap cross the wire before the drain drops them"
                );
                self.budget = None;
                self.last_error = Some(AttemptError::Exec(e));
                ControlFlow::Continue(())
            }
            Ok(Err(AttemptError::Fenced)) => {
                info!(path = job.path.declared, attempt = attempts, "another replica holds the run's drain claim; leaving the path to it, nothing committed");
                ControlFlow::Break(None)
            }
            Ok(Err(e)) if e.retried(self.idle_retried) => {
                self.idle_retried |= matches!(e, AttemptError::Idle(_));
                self.back_off(e).await
            }
            Ok(Err(e)) => self.fail(
                describe_failure(&e, job.store.url, job.store.tenant),
                e.metric_label(),
            ),
            Err(_) => self.fail(
                format!(
                    "drain timeout reached while attempt {attempts} was still streaming{}",
                    self.last_cause()
                ),
                "timeout",
            ),
        }
    }

    /// A transient failure: counted, then a pause (doubling up to [`MAX_BACKOFF`], never past
    /// the deadline) before the next attempt.
    async fn back_off(&mut self, e: AttemptError) -> Next {
        let job = self.job;
        warn!(path = job.path.declared, attempt = self.attempts, error = %e, "drain attempt failed; retrying");
        job.control
            .metrics
            .drain_failures
            .with_label_values(&[e.metric_label()])
            .inc();
        let left = job
            .limits
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            () = job.control.cancel.cancelled() => return ControlFlow::Break(None),
            () = tokio::time::sleep(self.backoff.min(left)) => {}
        }
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.last_error = Some(e);
        ControlFlow::Continue(())
    }
}

fn finish(
    job: &PathJob<'_>,
    status: ReadBackStatus,
    started: Instant,
    failure: Option<&str>,
) -> ReadBackStatus {
    let phase = status.phase.as_str();
    job.control.metrics.drains.with_label_values(&[phase]).inc();
    job.control
        .metrics
        .drain_duration
        .with_label_values(&[phase])
        .observe(started.elapsed().as_secs_f64());
    job.control
        .metrics
        .drained_bytes
        .with_label_values(&[job.limits.compression.as_str()])
        .inc_by(status.bytes);
    if let Some(reason) = failure {
        job.control
            .metrics
            .drain_failures
            .with_label_values(&[reason])
            .inc();
    }
    if status.dropped_members > 0 {
        job.control
            .metrics
            .members_refused
            .with_label_values(&["dropped", "cap"])
            .inc_by(status.dropped_members);
    }
    if status.rejected_members > 0 {
        job.control
            .metrics
            .members_refused
            .with_label_values(&["rejected", "sanitizer"])
            .inc_by(status.rejected_members);
    }
    status
}

/// One attempt: exec the packer, stream its tar into the archive, check how the packer ended,
/// then commit the manifest.
async fn attempt(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    opts: &DrainOptions,
    ctx: ManifestContext,
    (budget, wire): (Option<u64>, Wire),
    last_written: &mut Option<[u8; 32]>,
) -> Result<Manifest, AttemptError> {
    let argv = pack_argv(job.pod.pack_command, job.path.holder_path, budget, wire);
    let mut exec = PackExec::start(job.pod.pods, job.pod.name, argv).await?;
    let stdout = exec.take_stdout().ok_or(AttemptError::NoStdout)?;
    let started = jiff::Timestamp::now();
    let (outcome, exec, wire_record) = stream_archive(job, keys, opts, exec, stdout).await?;
    let notes = packer_notes(job, keys, &outcome, exec).await?;
    let mut manifest = Manifest::from_outcome(
        &ctx,
        keys,
        opts.stored(),
        outcome,
        started,
        jiff::Timestamp::now(),
    );
    notes.record_in(&mut manifest);
    manifest.run_attempt = job.generation.attempt;
    manifest.checkpoint = job.generation.checkpoint;
    manifest.wire = Some(wire_record);
    *last_written = Some(manifest.content_digest());
    commit(job, keys, manifest).await
}

/// Streams the packer's stdout (whatever its wire encoding) through the pipeline into the
/// archive upload; on failure the upload is aborted and the error says whose failure it was.
async fn stream_archive(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    opts: &DrainOptions,
    exec: PackExec,
    stdout: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
) -> Result<(DrainOutcome, PackExec, WireRecord), AttemptError> {
    // docs/contract.md "Drain memory": a packer that stalls or trickles is cut off.
    let (stdout, idled) = IdleGuard::new(stdout, job.limits.idle);
    // Paced outside the idle bound: a drain waiting on its replica's bandwidth is not waiting on
    // the pod (src/drain/bandwidth.rs).
    let stdout = job.limits.bandwidth.throttle(stdout);
    // Whatever was asked, the stream says what it is (src/drain/wire.rs).
    let decoded = match crate::drain::wire::decode(stdout, opts.max_input_bytes).await {
        Ok(decoded) => decoded,
        Err(e) if idled.load(Ordering::Relaxed) => {
            exec.abandon().await;
            return Err(AttemptError::Idle(e.to_string()));
        }
        Err(e) => {
            return Err(AttemptError::Drain(DrainError {
                kind: DrainErrorKind::Read(e),
                progress: Default::default(),
            }))
        }
    };
    let wire_metric = job
        .control
        .metrics
        .drain_wire_bytes
        .with_label_values(&[decoded.wire.as_str()]);
    let mut writer = archive_writer(
        Arc::clone(job.store.objects),
        keys.archive.clone(),
        opts.max_input_bytes,
    );
    let (stdout, record) = decoded.split();
    let streamed = drain_stream(stdout, &mut writer, opts).await;
    let record = record.read();
    wire_metric.inc_by(record.bytes);
    let e = match streamed {
        Ok(outcome) => return Ok((outcome, exec, record)),
        Err(e) => e,
    };
    // No orphaned multipart parts: an aborted attempt leaves nothing behind.
    if let Err(abort) = writer.abort().await {
        warn!(archive = %keys.archive, error = %abort, "aborting the multipart upload failed");
    }
    if idled.load(Ordering::Relaxed) {
        exec.abandon().await;
        return Err(AttemptError::Idle(idle_message(job.limits.idle, &e)));
    }
    // A stream that breaks because the packer failed is the packer's failure (its exit
    // status and stderr say why, and retrying will not help); otherwise the stream's.
    if let Ok(Err(exec_err @ ExecError::Failed { .. })) =
        tokio::time::timeout(Duration::from_secs(2), exec.finish()).await
    {
        return Err(exec_err.into());
    }
    Err(e.into())
}

/// How the packer ended, and its notes. The archive is uploaded; it only becomes a result if the
/// packer says it finished cleanly — unless the drain stopped reading at its input bound, when
/// the packer never could finish — and stored something readable (else it is deleted).
async fn packer_notes(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    outcome: &DrainOutcome,
    exec: PackExec,
) -> Result<super::pod_notes::PodNotes, AttemptError> {
    let notes = if outcome.stopped_at_input_bound.is_some() {
        exec.abandon().await
    } else {
        match exec.finish().await {
            Ok(notes) => notes,
            Err(e) => {
                delete_archive(job, keys).await;
                return Err(e.into());
            }
        }
    };
    // The archive's in-band notes when the packer wrote them, else its stderr (docs/contract.md,
    // "The packer's notes travel in-band").
    let notes = pod_notes(outcome, notes);
    if let Some(message) = nothing_readable(outcome, &notes.lines, notes.unlisted_unreadable) {
        delete_archive(job, keys).await;
        return Err(AttemptError::NothingReadable(message));
    }
    Ok(notes)
}

/// Writes `manifest` create-only: the commit point (docs/contract.md).
async fn commit(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    manifest: Manifest,
) -> Result<Manifest, AttemptError> {
    // The fence (issue #38): a replica whose drain claim was taken over commits nothing. The
    // archive it uploaded stays: the key may hold the claim holder's archive by now.
    if let Some(fence) = job.control.fence {
        if !fence.holds().await {
            return Err(AttemptError::Fenced);
        }
    }
    let written = match write_manifest(job.store.objects, &keys.manifest, &manifest).await {
        Ok(written) => written,
        // The PUT may have committed before its response was lost (a create-only PUT is not
        // retried by the store client): read it back before calling the attempt failed.
        Err(e) => match try_read_manifest(job.store.objects, &keys.manifest).await {
            Ok(Some(existing)) if existing.same_content(&manifest) => {
                info!(path = job.path.declared, manifest = %keys.manifest, error = %e, "the manifest PUT failed on the wire but had committed");
                return Ok(existing);
            }
            _ => return Err(e.into()),
        },
    };
    match written {
        ManifestWrite::Created => {
            info!(run = %job.run.name, namespace = %job.run.namespace, path = %job.path.declared, manifest = %keys.manifest, "committed the path's manifest");
            Ok(manifest)
        }
        // Someone committed between our start and our write (two operators draining at once,
        // which leader election prevents): accept it only if it describes what we uploaded.
        ManifestWrite::AlreadyCommitted(existing) if existing.same_content(&manifest) => {
            Ok(*existing)
        }
        ManifestWrite::AlreadyCommitted(_) => Err(AttemptError::Drain(DrainError {
            kind: DrainErrorKind::ManifestConflict {
                key: keys.manifest.to_string(),
            },
            progress: Default::default(),
        })),
    }
}

/// The status message of a path cut off by the idle bound.
fn idle_message(idle: Duration, e: &DrainError) -> String {
    format!(
        "the packer kept the drain waiting {}s in all without sending {} bytes (the per-path idle bound, --drain-idle-timeout): cut off, nothing committed ({})",
        idle.as_secs(),
        super::idle::MIN_PROGRESS_BYTES,
        e.progress
    )
}

/// Deletes the archive of an attempt that will not be committed (best effort: without a manifest
/// no reader takes it for a result, and the next attempt overwrites the key).
async fn delete_archive(job: &PathJob<'_>, keys: &ObjectKeys) {
    if let Err(del) = job.store.objects.delete(&keys.archive).await {
        warn!(archive = %keys.archive, error = %del, "could not delete the archive of a failed attempt");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ReadBackPhase;
    use crate::drain::outcome::tests::member;
    use crate::store::object_keys;
    use crate::tar::sanitize::MemberKind;

    #[test]
    fn an_idle_cut_off_is_retried_once_then_final_and_says_why() {
        // docs/contract.md "Drain memory": a trickling pod would trickle again; the path fails at
        // once and releases its slot.
        let e = DrainError {
            kind: DrainErrorKind::Read(std::io::Error::from(std::io::ErrorKind::TimedOut)),
            progress: crate::drain::Progress {
                input_bytes: 11,
                ..Default::default()
            },
        };
        let idle = AttemptError::Idle(idle_message(Duration::from_secs(60), &e));
        assert!(!idle.is_transient());
        // Retried once (a stall can be the node's: a kubelet restarted mid-stream), then final.
        assert!(idle.retried(false));
        assert!(!idle.retried(true));
        assert_eq!(idle.metric_label(), "idle");
        let message = idle.to_string();
        assert!(message.contains("waiting 60s in all"), "{message}");
        assert!(message.contains("--drain-idle-timeout"), "{message}");
        assert!(message.contains("after 11 input bytes"), "{message}");
    }

    #[test]
    fn pack_refusal_is_final_a_lost_stream_is_retried() {
        let refused = AttemptError::Exec(ExecError::Failed {
            command: "pack /out".into(),
            status: "exit code 1".into(),
            stderr: vec![],
        });
        assert!(!refused.is_transient());
        assert!(AttemptError::Exec(ExecError::NoStatus {
            command: "pack".into()
        })
        .is_transient());
        let malformed = AttemptError::Drain(DrainError {
            kind: DrainErrorKind::Malformed("bad header".into()),
            progress: Default::default(),
        });
        assert!(!malformed.is_transient());
    }

    /// An in-memory store whose reads can be made to fail (a store that cannot answer), and that
    /// counts every write.
    #[derive(Debug, Default)]
    struct FlakyStore {
        inner: object_store::memory::InMemory,
        reads_fail: std::sync::atomic::AtomicBool,
        reads_refused: std::sync::atomic::AtomicBool,
        writes: std::sync::atomic::AtomicUsize,
    }

    impl std::fmt::Display for FlakyStore {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "FlakyStore")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for FlakyStore {
        async fn put_opts(
            &self,
            location: &object_store::path::Path,
            payload: object_store::PutPayload,
            opts: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &object_store::path::Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &object_store::path::Path,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            if self.reads_refused.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(object_store::Error::PermissionDenied {
                    path: location.to_string(),
                    source: "403 Forbidden".into(),
                });
            }
            if self.reads_fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "FlakyStore",
                    source: "connection reset by peer".into(),
                });
            }
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<
                'static,
                object_store::Result<object_store::path::Path>,
            >,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.inner.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &object_store::path::Path,
            to: &object_store::path::Path,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// A kube client that counts the requests it gets (an exec of the packer is one) and refuses
    /// them all.
    fn counting_client() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
        let (service, mut handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        tokio::spawn(async move {
            while let Some((_request, send)) = handle.next_request().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "forbidden", "reason": "Forbidden", "code": 403
                });
                send.send_response(
                    http::Response::builder()
                        .status(403)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .expect("response"),
                );
            }
        });
        (kube::Client::new(service, "ns"), count)
    }

    struct Bed {
        pods: Api<Pod>,
        execs: Arc<std::sync::atomic::AtomicUsize>,
        flaky: Arc<FlakyStore>,
        store: Arc<dyn ObjectStore>,
        prefix: object_store::path::Path,
        metrics: Metrics,
        command: Vec<String>,
        bandwidth: DrainBandwidth,
        run: RunId,
    }

    fn bed() -> Bed {
        let (client, execs) = counting_client();
        let flaky = Arc::new(FlakyStore::default());
        Bed {
            pods: Api::namespaced(client, "ns"),
            execs,
            store: flaky.clone(),
            flaky,
            prefix: object_store::path::Path::from("runs"),
            metrics: Metrics::new().expect("metrics"),
            command: vec!["pack".to_string()],
            bandwidth: DrainBandwidth::default(),
            run: RunId {
                namespace: "ns".into(),
                name: "r".into(),
                uid: "u".into(),
            },
        }
    }

    fn job<'a>(bed: &'a Bed, cancel: &'a CancellationToken, secs: u64) -> PathJob<'a> {
        PathJob {
            pod: PodSource {
                pods: &bed.pods,
                name: "p",
                pack_command: &bed.command,
            },
            store: StoreTarget {
                objects: &bed.store,
                open_uploads: None,
                prefix: &bed.prefix,
                url: "s3://bucket/runs",
                tenant: None,
            },
            run: &bed.run,
            generation: JobGeneration {
                attempt: 1,
                checkpoint: None,
            },
            path: PathSpec {
                index: 0,
                declared: "/out",
                holder_path: "/sandboxrun-readback/out",
                cap_bytes: 1 << 20,
                previous_attempts: 0,
            },
            limits: DrainLimits {
                compression: Compression::None,
                wire: Wire::Zstd,
                idle: crate::drain::idle::DEFAULT_IDLE_TIMEOUT,
                bandwidth: &bed.bandwidth,
                deadline: tokio::time::Instant::now() + Duration::from_secs(secs),
            },
            control: DrainControl {
                metrics: &bed.metrics,
                cancel,
                fence: None,
            },
        }
    }

    #[tokio::test]
    async fn a_manifest_read_error_is_retried_and_never_followed_by_an_upload() {
        let bed = bed();
        bed.flaky
            .reads_fail
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let cancel = CancellationToken::new();
        let status = drain_path(&job(&bed, &cancel, 2)).await.expect("a status");
        assert_eq!(status.phase, ReadBackPhase::Failed, "{status:?}");
        let message = status.message.unwrap_or_default();
        assert!(
            message.contains("the manifest (the commit point) could not be read"),
            "{message}"
        );
        assert_eq!(
            bed.execs.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no packer was started, so nothing could be uploaded"
        );
        assert_eq!(
            bed.flaky.writes.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[tokio::test]
    async fn a_manifest_read_refused_for_credentials_fails_at_once_naming_the_settings() {
        let bed = bed();
        bed.flaky
            .reads_refused
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let cancel = CancellationToken::new();
        // Retried reads would end at the deadline with the "could not be read" timeout message.
        let status = drain_path(&job(&bed, &cancel, 3)).await.expect("a status");
        assert_eq!(status.phase, ReadBackPhase::Failed, "{status:?}");
        let message = status.message.unwrap_or_default();
        assert!(
            message.contains("refused the operator's credentials"),
            "{message}"
        );
        assert!(message.contains("AWS_SECRET_ACCESS_KEY"), "{message}");
        assert_eq!(bed.execs.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            bed.flaky.writes.load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[tokio::test]
    async fn a_committed_path_is_recorded_and_a_cancelled_drain_records_nothing() {
        let bed = bed();
        let run = RunId {
            namespace: "ns".into(),
            name: "r".into(),
            uid: "u".into(),
        };
        let keys = object_keys(&bed.prefix, &run, 0, "/out", Compression::None);
        let ctx = ManifestContext {
            run,
            declared_path: "/out".into(),
            index: 0,
            attempt: 1,
        };
        let now = jiff::Timestamp::now();
        let outcome = DrainOutcome {
            members: vec![member("a.txt", MemberKind::File)],
            bytes: 1,
            ..Default::default()
        };
        let opts = DrainOptions::new(1 << 20, Compression::None);
        let manifest = Manifest::new(&ctx, &keys, opts.stored(), &outcome, now, now);
        write_manifest(&bed.store, &keys.manifest, &manifest)
            .await
            .expect("commit");
        let writes = bed.flaky.writes.load(std::sync::atomic::Ordering::SeqCst);

        let cancel = CancellationToken::new();
        let status = drain_path(&job(&bed, &cancel, 5)).await.expect("a status");
        assert_eq!(status.phase, ReadBackPhase::Drained, "{status:?}");
        assert_eq!(status.members, 1);
        assert_eq!(bed.execs.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            bed.flaky.writes.load(std::sync::atomic::Ordering::SeqCst),
            writes,
            "nothing written over a committed path"
        );

        // A replica told to stop (lost lease) records nothing and starts nothing.
        let other = bed_uncommitted();
        cancel.cancel();
        assert_eq!(drain_path(&job(&other, &cancel, 5)).await, None);
        assert_eq!(other.execs.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    fn bed_uncommitted() -> Bed {
        bed()
    }

    #[test]
    fn a_store_that_refuses_the_credentials_fails_the_path_at_once_naming_the_settings() {
        let denied = || object_store::Error::PermissionDenied {
            path: "runs/a.tar".into(),
            source: "403 AuthorizationFailure".into(),
        };
        // On the archive upload (an io::Error out of the writer) and on the manifest.
        let upload = AttemptError::Drain(DrainError {
            kind: DrainErrorKind::Write(denied().into()),
            progress: Default::default(),
        });
        let manifest = AttemptError::Store(StoreError::Object {
            op: "writing manifest",
            key: "runs/a.manifest.json".into(),
            source: denied(),
        });
        for e in [&upload, &manifest] {
            assert!(!e.is_transient(), "{e}");
            assert_eq!(e.metric_label(), "store_credentials");
            let message = describe_failure(e, "az://runs/prod", None);
            assert!(
                message.starts_with("Azure Blob Storage refused the operator's credentials"),
                "{message}"
            );
            assert!(message.contains("AZURE_STORAGE_ACCOUNT_KEY"), "{message}");
            // A tenant store's refusal is the tenant's to fix: its ConfigMap, not the operator.
            let message = describe_failure(e, "az://t/runs", Some("team/sandboxrun-store"));
            assert!(
                message.starts_with(
                    "Azure Blob Storage refused the credentials of the namespace's store \
                     (ConfigMap team/sandboxrun-store)"
                ),
                "{message}"
            );
        }
        // An unreachable store is still retried.
        let unreachable = AttemptError::Drain(DrainError {
            kind: DrainErrorKind::Write(std::io::Error::other("connection refused")),
            progress: Default::default(),
        });
        assert!(unreachable.is_transient());
        assert_eq!(unreachable.metric_label(), "write");
        // A store's failure names the store (a tenant's among them); the pod's does not.
        let named = describe_failure(
            &unreachable,
            "gs://tenant-bucket/runs",
            Some("t/sandboxrun-store"),
        );
        assert!(
            named.starts_with("the store gs://tenant-bucket/runs: drain failed: writing"),
            "{named}"
        );
        assert_eq!(
            describe_failure(&AttemptError::NoStdout, "gs://tenant-bucket/runs", None),
            "the exec of the packer has no stdout"
        );
    }
}
