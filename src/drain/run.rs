//! One declared path's drain, end to end: exec `pack` in the holder, stream its tar through the
//! pipeline into the store, and commit — retrying transient failures with backoff until the run's
//! drain deadline. The outcome is always a status entry: a failure is reported as Failed with its
//! cause, never as an empty set (ADR-143 §4).
//!
//! Commit order matters: the archive is uploaded, THEN the exec status is checked, THEN the
//! manifest is written create-only. A packer that exited non-zero (or a stream that lost its
//! status) never gets a manifest, so no reader can mistake a partial archive for a result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use object_store::{ObjectStore, ObjectStoreExt};
use thiserror::Error;
use tracing::{info, warn};

use super::archive::{drain_stream, DrainError, DrainErrorKind, DrainOptions};
use super::exec::{ExecError, PackExec};
use crate::api::{Compression, ReadBackPhase, ReadBackStatus};
use crate::metrics::Metrics;
use crate::store::{
    archive_writer, object_keys, try_read_manifest, write_manifest, Manifest, ManifestContext,
    ManifestWrite, ObjectKeys, RunRef, StoreError,
};

/// Longest pause between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// Everything one path's drain needs.
pub struct PathJob<'a> {
    /// Pods of the run's namespace.
    pub pods: &'a Api<Pod>,
    /// The run's pod.
    pub pod_name: &'a str,
    /// argv of the packer (the path is appended).
    pub pack_command: &'a [String],
    /// The store.
    pub store: &'a Arc<dyn ObjectStore>,
    /// Key prefix in the store.
    pub store_prefix: &'a object_store::path::Path,
    /// Store URL (to render object URLs).
    pub store_url: &'a str,
    /// Run namespace.
    pub namespace: &'a str,
    /// Run name.
    pub run_name: &'a str,
    /// Run uid.
    pub run_uid: &'a str,
    /// Position of the path in spec.readBack.paths.
    pub index: usize,
    /// The declared container path.
    pub path: &'a str,
    /// Effective cap.
    pub cap_bytes: u64,
    /// Compression.
    pub compression: Compression,
    /// When the run's drain timeout ends.
    pub deadline: tokio::time::Instant,
    /// Attempts already made (recorded in status by an earlier operator).
    pub previous_attempts: u32,
    /// Metrics.
    pub metrics: &'a Metrics,
}

/// Why one attempt failed.
#[derive(Debug, Error)]
pub enum AttemptError {
    /// The exec transport.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The stream or its upload.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// The store (manifest).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The exec gave no stdout.
    #[error("the exec of the packer has no stdout")]
    NoStdout,
}

impl AttemptError {
    /// Whether another attempt may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            AttemptError::Exec(ExecError::Start { source, .. }) => {
                // Gone, forbidden or refused will not change by retrying.
                !matches!(start_status(source), Some(400 | 403 | 404))
            }
            AttemptError::Exec(e) => e.is_transient(),
            AttemptError::Drain(e) => matches!(
                e.kind,
                DrainErrorKind::Read(_)
                    | DrainErrorKind::Write(_)
                    | DrainErrorKind::Store(_)
                    | DrainErrorKind::Truncated(_)
            ),
            AttemptError::Store(_) => true,
            AttemptError::NoStdout => true,
        }
    }

    /// Stable label for the failures metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            AttemptError::Exec(ExecError::Start { .. }) => "exec_start",
            AttemptError::Exec(ExecError::Failed { .. }) => "pack_failed",
            AttemptError::Exec(ExecError::NoStatus { .. }) => "exec_lost",
            AttemptError::Drain(e) => e.metric_label(),
            AttemptError::Store(_) => "store",
            AttemptError::NoStdout => "exec_no_stdout",
        }
    }
}

/// The HTTP status with which the apiserver refused to start an exec, if it did.
fn start_status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(ae) => Some(ae.code),
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
            code,
        )) => Some(code.as_u16()),
        _ => None,
    }
}

/// Words for a failure, with what to do when the cause is the operator's own RBAC.
fn describe_failure(e: &AttemptError) -> String {
    match e {
        AttemptError::Exec(ExecError::Start { source, .. }) if start_status(source) == Some(403) => format!(
            "{e} (Forbidden: the operator's ServiceAccount needs create/get on pods/exec in this namespace)"
        ),
        _ => e.to_string(),
    }
}

/// Renders the URL of an object of the store.
pub fn object_url(store_url: &str, key: &object_store::path::Path) -> String {
    // A file:// store is rooted at the URL's directory; elsewhere the key already carries the
    // URL's prefix, so only scheme and bucket are kept.
    match url::Url::parse(store_url) {
        Ok(u) if u.scheme() == "file" => format!("{}/{key}", store_url.trim_end_matches('/')),
        Ok(u) => format!(
            "{}://{}/{key}",
            u.scheme(),
            u.host_str().unwrap_or_default()
        ),
        Err(_) => key.to_string(),
    }
}

/// The status entry of a committed manifest.
pub fn committed_status(
    path: &str,
    manifest: &Manifest,
    keys: &ObjectKeys,
    store_url: &str,
    attempts: u32,
) -> ReadBackStatus {
    let phase = manifest.phase;
    let message = match phase {
        ReadBackPhase::Empty => Some("the workload wrote nothing at this path".to_string()),
        ReadBackPhase::Capped => Some(format!(
            "cap of {} bytes reached: {} member(s) ({} bytes) dropped, listed in the manifest",
            manifest.cap_bytes, manifest.totals.dropped_members, manifest.totals.dropped_bytes
        )),
        _ if manifest.totals.rejected_members > 0 => Some(format!(
            "{} unsafe member(s) rejected, listed in the manifest",
            manifest.totals.rejected_members
        )),
        _ if !manifest.pod_notes.is_empty() => Some(format!(
            "the packer reported {} problem(s) in the pod (unreadable or special files), listed in the manifest's podNotes: {}",
            manifest.pod_notes.len(),
            manifest.pod_notes.first().map(String::as_str).unwrap_or_default()
        )),
        _ => None,
    };
    ReadBackStatus {
        path: path.to_string(),
        phase,
        bytes: manifest.totals.bytes,
        members: manifest.totals.members,
        dropped_members: manifest.totals.dropped_members,
        rejected_members: manifest.totals.rejected_members,
        object: Some(object_url(store_url, &keys.archive)),
        manifest: Some(object_url(store_url, &keys.manifest)),
        attempts,
        message,
    }
}

/// Drains one path; never returns an error — a failure is a Failed entry with its cause.
pub async fn drain_path(job: &PathJob<'_>) -> ReadBackStatus {
    let started = Instant::now();
    let run = RunRef {
        namespace: job.namespace.to_string(),
        name: job.run_name.to_string(),
        uid: job.run_uid.to_string(),
    };
    let keys = object_keys(job.store_prefix, &run, job.index, job.path, job.compression);
    let opts = DrainOptions::new(job.cap_bytes, job.compression);
    let mut attempts = job.previous_attempts;
    let mut backoff = Duration::from_secs(1);
    let mut last_error: Option<AttemptError> = None;

    // An earlier operator may have committed this path and died before recording it.
    if let Ok(Some(manifest)) = try_read_manifest(job.store, &keys.manifest).await {
        info!(path = job.path, manifest = %keys.manifest, "already committed; recording it");
        return finish(
            job,
            committed_status(job.path, &manifest, &keys, job.store_url, attempts),
            started,
            None,
        );
    }

    loop {
        let remaining = job
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            let cause = last_error
                .as_ref()
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default();
            let status = failed(
                job.path,
                attempts,
                format!("drain timeout reached before the path was drained{cause}"),
            );
            return finish(job, status, started, Some("timeout"));
        }
        attempts += 1;
        let ctx = ManifestContext {
            run: run.clone(),
            declared_path: job.path.to_string(),
            index: job.index,
            attempt: attempts,
        };
        match tokio::time::timeout(remaining, attempt(job, &keys, &opts, ctx)).await {
            Ok(Ok(manifest)) => {
                let status = committed_status(job.path, &manifest, &keys, job.store_url, attempts);
                return finish(job, status, started, None);
            }
            Ok(Err(e)) if e.is_transient() => {
                warn!(path = job.path, attempt = attempts, error = %e, "drain attempt failed; retrying");
                job.metrics
                    .drain_failures
                    .with_label_values(&[e.metric_label()])
                    .inc();
                let left = job
                    .deadline
                    .saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(backoff.min(left)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                last_error = Some(e);
            }
            Ok(Err(e)) => {
                let label = e.metric_label();
                let status = failed(job.path, attempts, describe_failure(&e));
                return finish(job, status, started, Some(label));
            }
            Err(_) => {
                let cause = last_error
                    .as_ref()
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default();
                let status = failed(
                    job.path,
                    attempts,
                    format!(
                        "drain timeout reached while attempt {attempts} was still streaming{cause}"
                    ),
                );
                return finish(job, status, started, Some("timeout"));
            }
        }
    }
}

fn failed(path: &str, attempts: u32, message: String) -> ReadBackStatus {
    ReadBackStatus {
        path: path.to_string(),
        phase: ReadBackPhase::Failed,
        attempts,
        message: Some(message),
        ..ReadBackStatus::default()
    }
}

fn finish(
    job: &PathJob<'_>,
    status: ReadBackStatus,
    started: Instant,
    failure: Option<&str>,
) -> ReadBackStatus {
    let phase = format!("{:?}", status.phase);
    job.metrics.drains.with_label_values(&[&phase]).inc();
    job.metrics
        .drain_duration
        .with_label_values(&[&phase])
        .observe(started.elapsed().as_secs_f64());
    job.metrics
        .drained_bytes
        .with_label_values(&[&format!("{:?}", job.compression).to_lowercase()])
        .inc_by(status.bytes);
    if let Some(reason) = failure {
        job.metrics
            .drain_failures
            .with_label_values(&[reason])
            .inc();
    }
    if status.dropped_members > 0 {
        job.metrics
            .members_refused
            .with_label_values(&["dropped", "cap"])
            .inc_by(status.dropped_members);
    }
    if status.rejected_members > 0 {
        job.metrics
            .members_refused
            .with_label_values(&["rejected", "sanitizer"])
            .inc_by(status.rejected_members);
    }
    status
}

async fn attempt(
    job: &PathJob<'_>,
    keys: &ObjectKeys,
    opts: &DrainOptions,
    ctx: ManifestContext,
) -> Result<Manifest, AttemptError> {
    let mut exec = PackExec::start(job.pods, job.pod_name, job.pack_command, job.path).await?;
    let stdout = exec.take_stdout().ok_or(AttemptError::NoStdout)?;
    let started = jiff::Timestamp::now();
    let mut writer = archive_writer(Arc::clone(job.store), keys.archive.clone(), opts);
    let outcome = match drain_stream(stdout, &mut writer, opts).await {
        Ok(outcome) => outcome,
        Err(e) => {
            // No orphaned multipart parts: an aborted attempt leaves nothing behind.
            if let Err(abort) = writer.abort().await {
                warn!(archive = %keys.archive, error = %abort, "aborting the multipart upload failed");
            }
            // A stream that breaks because the packer failed is the packer's failure (its exit
            // status and stderr say why, and retrying will not help); otherwise the stream's.
            if let Ok(Err(exec_err @ ExecError::Failed { .. })) =
                tokio::time::timeout(Duration::from_secs(2), exec.finish()).await
            {
                return Err(exec_err.into());
            }
            return Err(e.into());
        }
    };
    // The archive is uploaded; it only becomes a result if the packer says it finished cleanly.
    let notes = match exec.finish().await {
        Ok(notes) => notes,
        Err(e) => {
            if let Err(del) = job.store.delete(&keys.archive).await {
                warn!(archive = %keys.archive, error = %del, "could not delete the archive of a failed attempt");
            }
            return Err(e.into());
        }
    };
    let mut manifest = Manifest::new(&ctx, keys, opts, &outcome, started, jiff::Timestamp::now());
    manifest.pod_notes = notes.lines;
    if notes.truncated > 0 {
        manifest.pod_notes.push(format!(
            "... and {} more line(s) from the packer",
            notes.truncated
        ));
    }
    match write_manifest(job.store, &keys.manifest, &manifest).await? {
        ManifestWrite::Created => Ok(manifest),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_urls_keep_scheme_and_bucket() {
        let key = object_store::path::Path::from("runs/ns/a/u/00-out.tar");
        assert_eq!(
            object_url("s3://bucket/runs", &key),
            "s3://bucket/runs/ns/a/u/00-out.tar"
        );
        assert_eq!(
            object_url("file:///var/lib/store", &key),
            "file:///var/lib/store/runs/ns/a/u/00-out.tar"
        );
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
}
