//! `sandboxrun-operator files ls|get`: read a run's drained files back from the object store, from
//! anywhere that can read the store (a laptop, a CI job). Also usable as `kubectl sandboxrun files`
//! when the binary is installed as `kubectl-sandboxrun`.
//!
//! Where: `--store-url` (or `SANDBOXRUN_STORE_URL`) names the store, and the run instance is the
//! one drained last (or `--uid`); this needs no cluster. Without it, the run is read from the
//! cluster and its `status.readBack[].object` names both the store and the instance
//! (`crate::plugin::locate`). The namespace is `-n`, else the kubeconfig context's, as kubectl's.
//!
//! `get` extracts through the same sanitizer as the drain and verifies every file against the
//! manifest's sha256: a stored archive is untrusted input too (an object store response).
//!
//! Permissions: `get` restores each file's and directory's stored permission bits masked by the
//! process umask, like `tar` without `-p` for a non-root user: `stored & 0o777 & !umask`. A 0600
//! secret stays 0600, a 0700 directory stays 0700, a 0777 file becomes 0755 under umask 022.
//! setuid, setgid and sticky are never restored. A file is created 0600 and gets its mode once
//! written and verified; a directory is 0700 while its contents are written and gets its mode
//! last (so a 0500 directory does not block writing its children). Ownership is not restored.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_compression::tokio::bufread::{GzipDecoder, ZstdDecoder};
use clap::{Args, Subcommand};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader};
use tokio_util::io::StreamReader;

use crate::api::Compression;
use crate::api::SandboxRun;
use crate::plugin::cluster::{self, ClusterArgs, ClusterError};
use crate::plugin::locate::{store_of_run, LocateError};
use crate::store::{list_manifests, Manifest, MemberRecord};
use crate::tar::entry::RawEntry;
use crate::tar::sanitize::{Decision, Limits, MemberKind, Reason, Sanitizer};
use crate::text::printable;

/// `files` arguments.
#[derive(Args, Debug)]
pub struct FilesArgs {
    /// ls or get.
    #[command(subcommand)]
    pub command: FilesCommand,
    /// The object store (the operator's --store-url and --store-option).
    #[command(flatten)]
    pub store: FilesStoreArgs,
    /// Which cluster and namespace.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Pick the run instance by uid (default: the one the run's status names, or with
    /// --store-url the most recently drained one).
    #[arg(long, global = true)]
    pub uid: Option<String>,
    /// The attempt whose files to read, for a run with `spec.retryPolicy` (from 1; default: its
    /// last attempt; docs/user-guide.md "Retries").
    #[arg(long, global = true)]
    pub attempt: Option<u32>,
    /// The checkpoint whose files to read (`spec.checkpoint`, from 1; docs/user-guide.md
    /// "Checkpoints"); without it, a teardown's files.
    #[arg(long, global = true, conflicts_with = "attempt")]
    pub checkpoint: Option<u32>,
}

/// The store flags of `files`: the operator's (`crate::store::StoreArgs`), except that the URL
/// has no default: without it the run's status names the store.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesStoreArgs {
    /// Object store URL: file:///dir, s3://bucket/prefix, gs://…, az://… (default: the store the
    /// run's status.readBack[].object names, read from the cluster).
    #[arg(long, global = true, env = "SANDBOXRUN_STORE_URL")]
    pub store_url: Option<String>,
    /// `--store-option`, as the operator's.
    #[command(flatten)]
    pub store_options: crate::store::StoreOptions,
}

/// Which store, namespace and instance `files` reads: see [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The store URL.
    pub store_url: String,
    /// The run's namespace.
    pub namespace: String,
    /// The run instance, when known (else the most recently drained one).
    pub uid: Option<String>,
    /// The namespace's own store, with its Secret's credentials, when the run's status names it
    /// and no `--store-url`/`--store-option` was given (docs/contract.md "A store per
    /// namespace"); None: the URL with the options and the environment.
    pub store_config: Option<crate::store::StoreConfig>,
}

/// `files` subcommands.
#[derive(Subcommand, Debug)]
pub enum FilesCommand {
    /// List the drained members of a run (dropped and rejected ones marked).
    Ls {
        /// The SandboxRun name.
        run: String,
    },
    /// Download and extract a run's drained files into a directory, verified against the manifest.
    ///
    /// Each file and directory gets its stored permission bits masked by the umask, like `tar`
    /// without `-p` (0600 stays 0600; 0777 becomes 0755 under umask 022); setuid, setgid and
    /// sticky bits are never restored, nor is ownership.
    Get {
        /// The SandboxRun name.
        run: String,
        /// Only this declared path.
        #[arg(long)]
        path: Option<String>,
        /// Output directory (created; each declared path goes to <index>-<slug>/).
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
}

/// Why `files` failed.
#[derive(Debug, Error)]
pub enum FilesError {
    /// Bad store options.
    #[error("{0}")]
    Usage(String),
    /// The store.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Nothing stored for the run.
    #[error("nothing is stored for {namespace}/{run} (no manifest: never drained, or a different store URL){where_}")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Run.
        run: String,
        /// Where a `file://` store is ([`file_store_hint`]), empty for any other store.
        where_: String,
    },
    /// The cluster could not be read to find the run's store.
    #[error("{0}; pass --store-url to read the store without the cluster")]
    Cluster(#[from] ClusterError),
    /// The run is not in the cluster (a deleted run's files are read with --store-url).
    #[error("no SandboxRun {namespace}/{run} in the cluster (pass -n, or --store-url to read a deleted run's files)")]
    NoRun {
        /// Namespace.
        namespace: String,
        /// Run.
        run: String,
    },
    /// Reading the run failed.
    #[error("cannot read SandboxRun {namespace}/{run}: {source}")]
    ReadRun {
        /// Namespace.
        namespace: String,
        /// Run.
        run: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The run's status does not say where its files are.
    #[error(transparent)]
    Locate(#[from] LocateError),
    /// Reading or writing.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The stored archive does not match its manifest.
    #[error("{0}")]
    Verify(String),
}

impl FilesArgs {
    /// The run name.
    pub fn run_name(&self) -> &str {
        match &self.command {
            FilesCommand::Ls { run } | FilesCommand::Get { run, .. } => run,
        }
    }
}

/// The store, namespace and instance to read: with `--store-url`, that store, `-n` (else the
/// kubeconfig context's namespace, else `default`) and `--uid`; without it, the run is read from
/// the cluster and its `status.readBack[].object` names the store and the instance (`--uid`
/// still wins).
pub async fn resolve(args: &FilesArgs) -> Result<Target, FilesError> {
    if let Some(store_url) = &args.store.store_url {
        return Ok(Target {
            store_url: store_url.clone(),
            namespace: cluster::namespace(&args.cluster).await?,
            uid: args.uid.clone(),
            store_config: None,
        });
    }
    let (client, namespace) = cluster::connect(&args.cluster).await?;
    let run_name = args.run_name();
    let runs: kube::Api<SandboxRun> = kube::Api::namespaced(client.clone(), &namespace);
    let run = runs
        .get_opt(run_name)
        .await
        .map_err(|source| FilesError::ReadRun {
            namespace: namespace.clone(),
            run: run_name.to_string(),
            source,
        })?
        .ok_or_else(|| FilesError::NoRun {
            namespace: namespace.clone(),
            run: run_name.to_string(),
        })?;
    let located = store_of_run(&run)?;
    tracing::debug!(store = %located.store_url, uid = %located.uid, "store found in the run's status");
    let store_config = if args.store.store_options.options.is_empty() {
        namespace_store(&client, &namespace, &run, &located.store_url).await
    } else {
        None
    };
    Ok(Target {
        store_url: located.store_url,
        namespace,
        uid: Some(args.uid.clone().unwrap_or(located.uid)),
        store_config,
    })
}

/// The namespace's own store (its ConfigMap and Secret, read with the caller's rights) when it
/// is the store the run's status names; else None, and the environment's credentials are used
/// (a ConfigMap or Secret the caller cannot read is said, not fatal: the environment may hold
/// the credentials).
async fn namespace_store(
    client: &kube::Client,
    namespace: &str,
    run: &SandboxRun,
    located_url: &str,
) -> Option<crate::store::StoreConfig> {
    match crate::store::tenant_read::for_reader(client, namespace, run.spec.store_ref()).await {
        Ok(Some(tenant)) if same_store(&tenant.url, located_url) => Some(tenant.config),
        Ok(Some(tenant)) => {
            tracing::debug!(namespace_store = %tenant.url, run_store = %located_url, "the run's files are not in its namespace's store now");
            None
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the namespace's store is not used; reading with the environment's credentials");
            None
        }
    }
}

/// Whether two store URLs name the same bucket and prefix.
fn same_store(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Runs `files`, writing the report to `out`.
pub async fn run_to(args: FilesArgs, out: &mut impl Write) -> Result<(), FilesError> {
    let target = resolve(&args).await?;
    run_at(args, &target, out).await
}

/// Runs `files` against `target` (see [`resolve`]), writing the report to `out`.
pub async fn run_at(
    args: FilesArgs,
    target: &Target,
    out: &mut impl Write,
) -> Result<(), FilesError> {
    let options = args
        .store
        .store_options
        .parse()
        .map_err(|e| FilesError::Usage(e.to_string()))?;
    let (store, prefix) = match &target.store_config {
        Some(config) => config.build()?,
        None => crate::store::store_from_url(&target.store_url, &options)?,
    };
    let run_name = args.run_name().to_string();
    let all = list_manifests(&store, &prefix, &target.namespace, &run_name).await?;
    let instance = pick_instance(all, target.uid.as_deref());
    let manifests = match args.checkpoint {
        Some(n) => instance
            .into_iter()
            .filter(|m| m.checkpoint == Some(n))
            .collect(),
        None => pick_attempt(
            instance
                .into_iter()
                .filter(|m| m.checkpoint.is_none())
                .collect(),
            args.attempt,
        ),
    };
    if manifests.is_empty() {
        return Err(FilesError::NotFound {
            namespace: target.namespace.clone(),
            run: run_name,
            where_: file_store_hint(&target.store_url),
        });
    }
    match args.command {
        FilesCommand::Ls { .. } => {
            for m in &manifests {
                write_listing(out, m)?;
            }
            Ok(())
        }
        FilesCommand::Get { path, output, .. } => {
            get_to(&store, &manifests, &run_name, path, &output, out).await
        }
    }
}

/// What to add to "nothing is stored" when the store is `file://`: that URL is a directory on the
/// machine running this command, while the operator's `file://` store (the chart's default) is a
/// directory inside the operator's pod (docs/operations.md "Stores"), so from a laptop it is
/// always empty. Empty for any other store.
pub(crate) fn file_store_hint(store_url: &str) -> String {
    if !store_url.starts_with("file://") {
        return String::new();
    }
    format!(
        "; {store_url} is read on this machine, but the operator's file:// store is a directory \
         inside the operator's pod (its volume), not here: read it from there \
         (kubectl exec into the operator's pod) or give the operator an S3, GCS or Azure store"
    )
}

/// A failed write of the report.
fn write_failed(source: std::io::Error) -> FilesError {
    FilesError::Io {
        what: "write".to_string(),
        source,
    }
}

/// `files ls` of one declared path: its totals, then every member, dropped, noted and rejected
/// record.
fn write_listing(out: &mut impl Write, m: &Manifest) -> Result<(), FilesError> {
    writeln!(
        out,
        "{} [{}] {} member(s), {} byte(s), {} dropped, {} rejected{} (run uid {})",
        printable(&m.declared_path),
        m.phase.as_str(),
        m.totals.members,
        m.totals.bytes,
        m.totals.dropped_members,
        m.totals.rejected_members,
        changed_count(m),
        printable(&m.run.uid)
    )
    .map_err(write_failed)?;
    for member in &m.members {
        write_member(out, member)?;
    }
    write_dropped(out, m)?;
    write_changed(out, m)?;
    if let Some(bound) = m.stopped_at_input_bound {
        writeln!(
            out,
            "  STOPPED at the drain's input bound of {bound} bytes: anything after the last entry listed was not read"
        )
        .map_err(write_failed)?;
    }
    for note in &m.pod_notes {
        writeln!(out, "  NOTE     {}", printable(note)).map_err(write_failed)?;
    }
    write_rejected(out, m)
}

/// One member line of `files ls`.
fn write_member(out: &mut impl Write, member: &MemberRecord) -> Result<(), FilesError> {
    // A manifest is untrusted input too: a tampered sha may be any text.
    let sha = member
        .sha256
        .as_deref()
        .map(|s| printable(&s.chars().take(12).collect::<String>()).into_owned())
        .unwrap_or_else(|| "-".into());
    let link = member
        .link_target
        .as_deref()
        .map(|t| format!(" -> {}", printable(t)))
        .unwrap_or_default();
    writeln!(
        out,
        "  {:<7} {:>12}  {:<12}  {}{}",
        kind_word(member.kind),
        member.size,
        sha,
        printable(&member.path),
        link
    )
    .map_err(write_failed)
}

/// The DROPPED lines of `files ls`, and how many more were counted but not listed.
fn write_dropped(out: &mut impl Write, m: &Manifest) -> Result<(), FilesError> {
    let rows = m
        .dropped
        .iter()
        .map(|d| (d.size, printable(&d.path), printable(dropped_why(d))));
    let bound = "the manifest's bound on listed records";
    write_records(out, "DROPPED", rows, m.totals.dropped_members, bound)
}

/// The CHANGED lines of `files ls`: stored files whose content changed while the packer read
/// them (docs/contract.md, "A changed file is never stored as a clean one").
fn write_changed(out: &mut impl Write, m: &Manifest) -> Result<(), FilesError> {
    let rows = m
        .changed
        .iter()
        .map(|c| (c.stat_size, printable(&c.path), changed_why(c)));
    let bound = "the packer's bound on listed notes";
    write_records(out, "CHANGED", rows, m.totals.changed_members, bound)
}

/// One `<label>` line per listed record (size, path, why), then how many of the `total` were
/// counted but not listed (`bound` says why).
fn write_records<P: std::fmt::Display, W: std::fmt::Display>(
    out: &mut impl Write,
    label: &str,
    rows: impl ExactSizeIterator<Item = (u64, P, W)>,
    total: u64,
    bound: &str,
) -> Result<(), FilesError> {
    let listed = rows.len() as u64;
    for (size, path, why) in rows {
        writeln!(out, "  {label} {size:>12}  {:<12}  {path} ({why})", "-").map_err(write_failed)?;
    }
    let unlisted = total.saturating_sub(listed);
    if unlisted > 0 {
        writeln!(
            out,
            "  {label} ... and {unlisted} more, counted but not listed ({bound})"
        )
        .map_err(write_failed)?;
    }
    Ok(())
}

/// What a changed member holds, in words.
fn changed_why(c: &crate::store::manifest::ChangedRecord) -> String {
    match c.reason.as_str() {
        "grew" => format!(
            "it grew while read: the first {} bytes are stored",
            c.stat_size
        ),
        "shrunk" => format!(
            "it shrank while read: {} bytes read, zero-padded to {}",
            c.read_size, c.stat_size
        ),
        "read_error" => format!(
            "a read failed after {} bytes: zero-padded to {}",
            c.read_size, c.stat_size
        ),
        "modified" => format!(
            "it was written while read (same size, {} bytes): it may mix old and new content",
            c.stat_size
        ),
        other => format!("changed while read ({})", printable(other)),
    }
}

/// The REJECTED lines of `files ls`, and how many more were counted but not listed.
fn write_rejected(out: &mut impl Write, m: &Manifest) -> Result<(), FilesError> {
    for r in &m.rejected {
        writeln!(
            out,
            "  REJECTED {:>11}  {:<12}  {} ({})",
            "-",
            "-",
            printable(&r.path),
            r.reason
        )
        .map_err(write_failed)?;
    }
    let unlisted = m
        .totals
        .rejected_members
        .saturating_sub(m.rejected.len() as u64);
    if unlisted > 0 {
        writeln!(
            out,
            "  REJECTED ... and {unlisted} more, counted but not listed (the manifest's bound on listed records)"
        )
        .map_err(write_failed)?;
    }
    Ok(())
}

/// `, N changed` when files changed while the packer read them, else nothing.
fn changed_count(m: &Manifest) -> String {
    match m.totals.changed_members {
        0 => String::new(),
        n => format!(", {n} changed while read"),
    }
}

/// `files get`: extracts every chosen declared path to `<output>/<index>-<slug>/`.
async fn get_to(
    store: &Arc<dyn ObjectStore>,
    manifests: &[Manifest],
    run_name: &str,
    path: Option<String>,
    output: &Path,
    out: &mut impl Write,
) -> Result<(), FilesError> {
    let chosen: Vec<&Manifest> = manifests
        .iter()
        .filter(|m| path.as_deref().is_none_or(|p| p == m.declared_path))
        .collect();
    if chosen.is_empty() {
        return Err(FilesError::Usage(format!(
            "{run_name} declares no stored path {:?}",
            path.unwrap_or_default()
        )));
    }
    for m in chosen {
        let dir = output.join(format!(
            "{:02}-{}",
            m.index,
            crate::store::path_slug(&m.declared_path)
        ));
        let n = extract_verified(store, m, &dir).await?;
        writeln!(
            out,
            "{} -> {} ({n} member(s) verified{})",
            printable(&m.declared_path),
            dir.display(),
            changed_count(m)
        )
        .map_err(write_failed)?;
        if m.totals.changed_members > 0 {
            writeln!(
                out,
                "  warning: {} file(s) changed while the packer read them: their content is zero-padded or cut, not the file at any one moment (see `files ls`):",
                m.totals.changed_members
            )
            .map_err(write_failed)?;
            write_changed(out, m)?;
        }
    }
    Ok(())
}

/// Why a member was dropped, in words for `files ls`.
fn dropped_why(d: &crate::store::DroppedRecord) -> &str {
    match (d.reason.as_str(), d.in_pod) {
        (crate::store::manifest::DROPPED_OVER_CAP, true) => {
            "over the cap, dropped in the pod: only a placeholder was sent"
        }
        (crate::store::manifest::DROPPED_OVER_CAP, false) => "over the cap",
        (crate::store::manifest::DROPPED_INPUT_BOUND, _) => {
            "not read: it would have taken the stream past the drain's input bound"
        }
        (crate::store::manifest::DROPPED_METADATA, _) => {
            "its name and link target would take the path's stored metadata past its allowance"
        }
        (other, _) => other,
    }
}

fn kind_word(kind: MemberKind) -> &'static str {
    match kind {
        MemberKind::File => "file",
        MemberKind::Dir => "dir",
        MemberKind::Symlink => "symlink",
    }
}

/// The manifests of one run instance: `uid` if given, else the most recently finished one.
fn pick_instance(
    all: Vec<(object_store::path::Path, Manifest)>,
    uid: Option<&str>,
) -> Vec<Manifest> {
    let mut by_uid: BTreeMap<String, Vec<Manifest>> = BTreeMap::new();
    for (_, m) in all {
        by_uid.entry(m.run.uid.clone()).or_default().push(m);
    }
    let chosen = match uid {
        Some(u) => by_uid.remove(u),
        None => by_uid
            .into_values()
            .max_by(|a, b| latest(a).cmp(&latest(b))),
    };
    let mut v = chosen.unwrap_or_default();
    v.sort_by_key(|m| m.index);
    v
}

/// The manifests of one attempt of the run (`spec.retryPolicy`): `attempt`, else the last one
/// stored.
fn pick_attempt(manifests: Vec<Manifest>, attempt: Option<u32>) -> Vec<Manifest> {
    let Some(want) = attempt.or_else(|| manifests.iter().map(|m| m.run_attempt).max()) else {
        return manifests;
    };
    manifests
        .into_iter()
        .filter(|m| m.run_attempt == want)
        .collect()
}

fn latest(ms: &[Manifest]) -> String {
    ms.iter()
        .map(|m| m.finished_at.clone())
        .max()
        .unwrap_or_default()
}

/// The permission bits `files get` gives a member stored with `stored`: its rwx bits for user,
/// group and others masked by `umask`, as `tar` does without `-p` for a non-root user. setuid,
/// setgid and sticky are never kept (an archive is untrusted input).
pub(crate) fn extracted_mode(stored: u32, umask: u32) -> u32 {
    stored & 0o777 & !umask
}

/// The umask in `/proc/<pid>/status` text (`Umask:\t0022`, Linux 4.7 and later).
fn umask_from_proc_status(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .map(|m| m & 0o777)
}

/// The process umask, without changing it (reading it with umask(2) sets it, which races with
/// every other thread creating files): from `/proc/self/status`, else by creating a probe file
/// with mode 0777 in `dir` and reading back what the kernel left of it. When neither works, 077:
/// owner-only is never looser than what was stored.
async fn process_umask(dir: &Path) -> u32 {
    if let Ok(text) = tokio::fs::read_to_string("/proc/self/status").await {
        if let Some(umask) = umask_from_proc_status(&text) {
            return umask;
        }
    }
    let probe = dir.join(format!(".sandboxrun-umask-probe-{}", std::process::id()));
    let created = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o777)
        .open(&probe)
        .await;
    let umask = match created {
        Ok(file) => match file.metadata().await {
            Ok(meta) => !meta.permissions().mode() & 0o777,
            Err(_) => 0o077,
        },
        Err(_) => return 0o077,
    };
    let _ = tokio::fs::remove_file(&probe).await;
    umask
}

/// Opens the directory `components` below `root`, creating what is missing (0700), one
/// component at a time with `O_NOFOLLOW`: a component that is a symlink — one an earlier member
/// planted, or one that names a link on a case-insensitive filesystem — is refused, never
/// followed (docs/contract.md §3). `root` itself is the user's choice and may be a link.
fn open_dir_nofollow(root: &Path, components: &[&str]) -> std::io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{mkdirat, openat, Mode, OFlags, CWD};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd = openat(CWD, root, flags, Mode::empty())?;
    for c in components.iter().filter(|c| !c.is_empty()) {
        match mkdirat(&fd, *c, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        fd = openat(&fd, *c, flags | OFlags::NOFOLLOW, Mode::empty()).map_err(|e| {
            if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                std::io::Error::other(format!(
                    "{} is not a directory (a symbolic link?): refusing to follow it",
                    printable(c)
                ))
            } else {
                e.into()
            }
        })?;
    }
    Ok(fd)
}

fn parent_of<'a, 'b>(components: &'a [&'b str]) -> &'a [&'b str] {
    &components[..components.len().saturating_sub(1)]
}

fn leaf_of<'a>(components: &[&'a str]) -> &'a str {
    components.last().copied().unwrap_or_default()
}

/// Downloads the archive of `manifest`, extracts it under `dir` through the sanitizer, and checks
/// every file against the manifest's size and sha256. Returns the number of members written.
///
/// Permissions are restored as [`extracted_mode`] says (stored bits masked by the process umask,
/// never setuid/setgid/sticky). Files are created 0600 and get their mode once verified;
/// directories are 0700 while extracting and get their modes at the end, deepest first. After an
/// error, what was extracted keeps those owner-only modes.
pub async fn extract_verified(
    store: &Arc<dyn ObjectStore>,
    manifest: &Manifest,
    dir: &Path,
) -> Result<usize, FilesError> {
    let key = object_store::path::Path::from(manifest.archive_key.as_str());
    let reader = open_archive(store, manifest, &key).await?;
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|source| FilesError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
    let mut archive = tokio_tar::Archive::new(reader);
    let mut entries = archive
        .entries()
        .map_err(|e| FilesError::Verify(format!("archive {key}: {e}")))?;
    let mut extraction = Extraction {
        key: &key,
        dir,
        // The archive's members, in order, are the manifest's: each is checked against its record.
        expected: manifest.members.iter(),
        // The extraction may land on a case-insensitive or normalizing filesystem (macOS, Windows).
        sanitizer: Sanitizer::for_extraction(Limits::default()),
        umask: process_umask(dir).await,
        written: 0,
        skipped: Vec::new(),
        dir_modes: Vec::new(),
    };
    while let Some(entry) = entries.next().await {
        let entry =
            entry.map_err(|e| FilesError::Verify(format!("archive {key} is corrupt: {e}")))?;
        extraction.extract(entry).await?;
    }
    extraction.finish(manifest.members.len())
}

/// The decompressed byte stream of the stored archive of `manifest`.
pub(crate) async fn open_archive(
    store: &Arc<dyn ObjectStore>,
    manifest: &Manifest,
    key: &object_store::path::Path,
) -> Result<ArchiveReader, FilesError> {
    let got = store.get(key).await.map_err(|e| {
        FilesError::Verify(format!(
            "archive {key} listed by the manifest cannot be read: {e}"
        ))
    })?;
    let stream = got.into_stream().map_err(std::io::Error::other);
    let raw = BufReader::new(StreamReader::new(stream));
    Ok(match manifest.compression {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(GzipDecoder::new(raw)),
        Compression::Zstd => Box::new(ZstdDecoder::new(raw)),
    })
}

/// The decompressed archive, whatever its compression.
pub(crate) type ArchiveReader = Box<dyn AsyncRead + Unpin + Send>;
/// One member of the archive being extracted.
type ArchiveEntry = tokio_tar::Entry<tokio_tar::Archive<ArchiveReader>>;

/// The state of one `extract_verified`: where it writes, what the manifest still expects, and what
/// is left to do once every member is in place.
struct Extraction<'a> {
    /// The archive's key, for messages.
    key: &'a object_store::path::Path,
    /// The output directory.
    dir: &'a Path,
    /// The manifest's records not yet matched, in archive order.
    expected: std::slice::Iter<'a, MemberRecord>,
    sanitizer: Sanitizer,
    umask: u32,
    /// Members extracted, verified, or neutralized so far.
    written: usize,
    /// Members not written because they fold onto an extracted symlink.
    skipped: Vec<String>,
    /// Directory modes, applied last: a 0500 directory must not block writing its children.
    dir_modes: Vec<(String, u32)>,
}

impl<'a> Extraction<'a> {
    /// Judges one member, matches it to its manifest record, and writes (or verifies) it.
    async fn extract(&mut self, mut entry: ArchiveEntry) -> Result<(), FilesError> {
        let key = self.key;
        let corrupt =
            |e: std::io::Error| FilesError::Verify(format!("archive {key} is corrupt: {e}"));
        let raw = RawEntry::read(&entry).map_err(corrupt)?;
        let accepted = match raw.judge(&mut self.sanitizer) {
            Decision::Accept(a) => a,
            Decision::Ignore => return Ok(()),
            Decision::Reject(Reason::FoldsOntoSymlink) => return self.neutralize(&raw.path),
            Decision::Reject(reason) => {
                return Err(FilesError::Verify(format!(
                    "archive {key} holds an unsafe member {} ({reason}); refusing to extract it",
                    printable(&String::from_utf8_lossy(&raw.path))
                )))
            }
        };
        let rel = accepted.path.trim_end_matches('/').to_string();
        let shown = printable(&rel).into_owned();
        let record = self.next_record(&rel, accepted.kind, &shown)?;
        let target = self.dir.join(&rel);
        let components: Vec<&str> = rel.split('/').collect();
        let ioe = |what: String| move |source| FilesError::Io { what, source };
        let mode = extracted_mode(entry.header().mode().map_err(corrupt)?, self.umask);
        match accepted.kind {
            // A later member has the same path (last wins): verify this one, write nothing.
            MemberKind::File if record.superseded => {
                verify_superseded(&mut entry, record, key, &shown, &target).await?
            }
            MemberKind::Symlink if record.superseded => {}
            MemberKind::Dir if record.superseded => {
                open_dir_nofollow(self.dir, &components)
                    .map_err(ioe(format!("create {}", target.display())))?;
            }
            MemberKind::Dir => self.create_dir(&components, &target, mode)?,
            MemberKind::Symlink => {
                let to = accepted.link_target.as_deref().unwrap_or_default();
                create_symlink(self.dir, &components, &target, to)?
            }
            MemberKind::File => {
                self.write_file(&mut entry, record, &components, &target, &shown, mode)
                    .await?
            }
        }
        self.written += 1;
        Ok(())
    }

    /// Creates a directory 0700 (no link followed) and keeps `mode` for [`Extraction::finish`].
    fn create_dir(
        &mut self,
        components: &[&str],
        target: &Path,
        mode: u32,
    ) -> Result<(), FilesError> {
        let fd = open_dir_nofollow(self.dir, components).map_err(|source| FilesError::Io {
            what: format!("create {}", target.display()),
            source,
        })?;
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o700)).map_err(|e| {
            FilesError::Io {
                what: format!("chmod {}", target.display()),
                source: e.into(),
            }
        })?;
        self.dir_modes.push((components.join("/"), mode));
        Ok(())
    }

    /// A member stored and listed but that here would be written through a symlink: checked
    /// against its record and not written; the rest of the path still extracts.
    fn neutralize(&mut self, path_bytes: &[u8]) -> Result<(), FilesError> {
        let raw = String::from_utf8_lossy(path_bytes);
        let normalized: Vec<&str> = raw
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let shown = printable(&normalized.join("/")).into_owned();
        match self.expected.next() {
            Some(r) if r.path == normalized.join("/") => {}
            _ => {
                return Err(FilesError::Verify(format!(
                    "archive {} holds {shown}, which its manifest does not list there",
                    self.key
                )))
            }
        }
        tracing::warn!(member = %shown, "not extracted: on a case-insensitive or normalizing filesystem it would name an extracted symlink or a path below one");
        self.skipped.push(shown);
        self.written += 1;
        Ok(())
    }

    /// The manifest's next record, which must name `rel` as a member of `kind`.
    fn next_record(
        &mut self,
        rel: &str,
        kind: MemberKind,
        shown: &str,
    ) -> Result<&'a MemberRecord, FilesError> {
        let key = self.key;
        match self.expected.next() {
            Some(r) if r.path.trim_end_matches('/') == rel && r.kind == kind => Ok(r),
            Some(r) => Err(FilesError::Verify(format!(
                "archive {key} holds {shown} ({}) where its manifest lists {} ({})",
                kind_word(kind),
                printable(&r.path),
                kind_word(r.kind)
            ))),
            None => Err(FilesError::Verify(format!(
                "archive {key} holds {shown}, which its manifest does not list"
            ))),
        }
    }

    /// Writes a regular file 0600 (no link followed, never over an existing file), checks it
    /// against its record (removing it if it does not match), then gives it `mode`.
    async fn write_file(
        &self,
        entry: &mut ArchiveEntry,
        record: &MemberRecord,
        components: &[&str],
        target: &Path,
        shown: &str,
        mode: u32,
    ) -> Result<(), FilesError> {
        let ioe = |what: String| move |source| FilesError::Io { what, source };
        let parent = open_dir_nofollow(self.dir, parent_of(components))
            .map_err(ioe(format!("create the parent of {}", target.display())))?;
        // O_EXCL | O_NOFOLLOW below a directory opened without following any link.
        let fd = rustix::fs::openat(
            &parent,
            leaf_of(components),
            rustix::fs::OFlags::WRONLY
                | rustix::fs::OFlags::CREATE
                | rustix::fs::OFlags::EXCL
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| FilesError::Io {
            what: format!("create {}", target.display()),
            source: e.into(),
        })?;
        let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
        let (total, sha) = copy_hashed(entry, Some(&mut file), self.key, shown, target).await?;
        if !matches_record(record, total, &sha) {
            let _ = tokio::fs::remove_file(target).await;
            return Err(FilesError::Verify(format!(
                "{shown}: {total} bytes with sha256 {sha}, but the manifest says {} bytes with sha256 {}",
                record.size,
                printable(record.sha256.as_deref().unwrap_or("-"))
            )));
        }
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .await
            .map_err(ioe(format!("chmod {}", target.display())))
    }

    /// Checks every member was seen, applies the directory modes (deepest first) and reports the
    /// neutralized members. Returns the number of members written.
    fn finish(self, listed: usize) -> Result<usize, FilesError> {
        if self.written != listed {
            return Err(FilesError::Verify(format!(
                "archive {} holds {} member(s) but its manifest lists {listed}",
                self.key, self.written
            )));
        }
        let mut dir_modes = self.dir_modes;
        // Deepest first, so a directory that loses its owner's write or search bit does so only
        // once everything below it is in place.
        dir_modes.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.split('/').count()));
        for (rel, mode) in dir_modes {
            let components: Vec<&str> = rel.split('/').collect();
            let chmod = open_dir_nofollow(self.dir, &components).and_then(|fd| {
                rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode)).map_err(Into::into)
            });
            chmod.map_err(|source| FilesError::Io {
                what: format!("chmod {}", self.dir.join(&rel).display()),
                source,
            })?;
        }
        if let Some(first) = self.skipped.first() {
            tracing::warn!(
                count = self.skipped.len(),
                first = %first,
                "members not extracted: they fold onto an extracted symlink"
            );
        }
        Ok(self.written)
    }
}

/// Creates the symlink `components` pointing at `to`, below parents opened without following
/// any link.
fn create_symlink(
    dir: &Path,
    components: &[&str],
    target: &Path,
    to: &str,
) -> Result<(), FilesError> {
    let parent =
        open_dir_nofollow(dir, parent_of(components)).map_err(|source| FilesError::Io {
            what: format!("create the parent of {}", target.display()),
            source,
        })?;
    rustix::fs::symlinkat(to, &parent, leaf_of(components)).map_err(|e| FilesError::Io {
        what: format!("symlink {}", target.display()),
        source: e.into(),
    })
}

/// Checks a file member a later member replaces against its record, writing nothing.
async fn verify_superseded(
    entry: &mut ArchiveEntry,
    record: &MemberRecord,
    key: &object_store::path::Path,
    shown: &str,
    target: &Path,
) -> Result<(), FilesError> {
    let (total, sha) = copy_hashed(entry, None, key, shown, target).await?;
    if matches_record(record, total, &sha) {
        return Ok(());
    }
    Err(FilesError::Verify(format!(
        "{shown} (replaced by a later member): {total} bytes with sha256 {sha}, but the manifest says {} bytes with sha256 {}",
        record.size,
        printable(record.sha256.as_deref().unwrap_or("-"))
    )))
}

/// Reads a member to its end, hashing it and writing it to `file` if given. Returns its size and
/// hex sha256.
async fn copy_hashed(
    entry: &mut ArchiveEntry,
    mut file: Option<&mut tokio::fs::File>,
    key: &object_store::path::Path,
    shown: &str,
    target: &Path,
) -> Result<(u64, String), FilesError> {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut *entry, &mut buf)
            .await
            .map_err(|e| FilesError::Verify(format!("archive {key}: reading {shown}: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        if let Some(file) = file.as_deref_mut() {
            file.write_all(&buf[..n])
                .await
                .map_err(|source| FilesError::Io {
                    what: format!("write {}", target.display()),
                    source,
                })?;
        }
    }
    if let Some(file) = file {
        file.flush().await.map_err(|source| FilesError::Io {
            what: format!("write {}", target.display()),
            source,
        })?;
    }
    Ok((total, hex::encode(hasher.finalize())))
}

/// Whether `total` bytes hashing to `sha` are what `record` lists.
fn matches_record(record: &MemberRecord, total: u64, sha: &str) -> bool {
    total == record.size && record.sha256.as_deref() == Some(sha)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::ReadBackPhase;
    use crate::identity::RunId;
    use crate::store::MemberRecord;
    use crate::store::{Totals, MANIFEST_SCHEMA_VERSION};

    /// (path in the archive, tar type byte, stored mode, content)
    pub(crate) type Member<'a> = (&'a str, u8, u32, &'a [u8]);

    /// Stores an uncompressed archive of `members` and its manifest in a memory store.
    pub(crate) async fn stored(members: &[Member<'_>]) -> (Arc<dyn ObjectStore>, Manifest) {
        let (store, _) = crate::store::store_from_url("memory://", &[]).expect("memory store");
        let manifest = stored_at(&store, members).await;
        (store, manifest)
    }

    /// Stores an uncompressed archive of `members` in `store`; returns its manifest (not stored).
    async fn stored_at(store: &Arc<dyn ObjectStore>, members: &[Member<'_>]) -> Manifest {
        let mut tar = tar::Builder::new(Vec::new());
        let mut records = Vec::new();
        for (path, ty, mode, data) in members {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::new(*ty));
            h.set_path(path).expect("path");
            h.set_size(data.len() as u64);
            h.set_mode(*mode);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            tar.append(&h, *data).expect("append");
            let dir = *ty == b'5';
            records.push(MemberRecord {
                path: path.trim_end_matches('/').to_string(),
                kind: if dir {
                    MemberKind::Dir
                } else {
                    MemberKind::File
                },
                size: data.len() as u64,
                sha256: (!dir).then(|| hex::encode(Sha256::digest(data))),
                mode: mode & 0o777,
                link_target: None,
                superseded: false,
            });
        }
        let bytes = tar.into_inner().expect("tar");
        let key = object_store::path::Path::from("ns/job/u1/00-out.tar");
        store
            .put(&key, bytes.into())
            .await
            .expect("put the archive");
        Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            run: RunId {
                namespace: "ns".into(),
                name: "job".into(),
                uid: "u1".into(),
            },
            declared_path: "/out".into(),
            index: 0,
            archive_key: key.to_string(),
            compression: Compression::None,
            cap_bytes: 1 << 20,
            attempt: 1,
            started_at: "2026-11-30T12:00:00Z".into(),
            finished_at: "2026-11-30T12:00:01Z".into(),
            phase: ReadBackPhase::Drained,
            totals: Totals {
                members: records.len() as u64,
                ..Default::default()
            },
            members: records,
            dropped: Vec::new(),
            rejected: Vec::new(),
            stopped_at_input_bound: None,
            pod_notes: Vec::new(),
            changed: Vec::new(),
            run_attempt: 1,
            checkpoint: None,
            wire: None,
        }
    }

    #[tokio::test]
    async fn changed_members_are_listed_by_files_ls_and_get_warns() {
        let (store, mut m) = stored(&[("log", b'0', 0o644, &[b'x', 0, 0, 0])]).await;
        m.changed = vec![crate::store::manifest::ChangedRecord {
            path: "log".into(),
            reason: "shrunk".into(),
            stat_size: 4,
            read_size: 1,
        }];
        m.totals.changed_members = 3;
        let mut out = Vec::new();
        write_listing(&mut out, &m).expect("ls");
        let ls = String::from_utf8_lossy(&out).into_owned();
        assert!(ls.contains(", 3 changed while read (run uid"), "{ls}");
        assert!(
            ls.contains("CHANGED            4  -             log (it shrank while read: 1 bytes read, zero-padded to 4)"),
            "{ls}"
        );
        assert!(
            ls.contains("CHANGED ... and 2 more, counted but not listed"),
            "{ls}"
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let mut out = Vec::new();
        get_to(&store, &[m], "job", None, dir.path(), &mut out)
            .await
            .expect("get");
        let got = String::from_utf8_lossy(&out).into_owned();
        assert!(
            got.contains("(1 member(s) verified, 3 changed while read)"),
            "{got}"
        );
        assert!(
            got.contains("warning: 3 file(s) changed while the packer read them"),
            "{got}"
        );
        assert!(got.contains("CHANGED            4"), "{got}");
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .expect("extracted")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn stored_modes_are_masked_by_the_umask_and_never_keep_special_bits() {
        assert_eq!(extracted_mode(0o600, 0o022), 0o600);
        assert_eq!(extracted_mode(0o700, 0o022), 0o700);
        assert_eq!(extracted_mode(0o777, 0o022), 0o755);
        assert_eq!(extracted_mode(0o644, 0o077), 0o600);
        assert_eq!(extracted_mode(0o4755, 0o022), 0o755);
        assert_eq!(extracted_mode(0o2775, 0), 0o775);
        assert_eq!(extracted_mode(0o1777, 0o022), 0o755);
    }

    #[test]
    fn dropped_members_say_why() {
        let d = |reason: &str, in_pod| crate::store::DroppedRecord {
            path: "big".into(),
            size: 1,
            reason: reason.into(),
            in_pod,
        };
        assert_eq!(dropped_why(&d("over_cap", false)), "over the cap");
        assert!(dropped_why(&d("over_cap", true)).contains("in the pod"));
        assert!(dropped_why(&d("input_bound", false)).contains("input bound"));
        assert!(dropped_why(&d("over_metadata_allowance", false)).contains("metadata"));
        assert_eq!(dropped_why(&d("future_reason", false)), "future_reason");
    }

    #[test]
    fn control_characters_are_escaped_when_printed() {
        assert_eq!(printable("plain/name.txt"), "plain/name.txt");
        assert_eq!(printable("caf\u{e9} \u{1f600}"), "caf\u{e9} \u{1f600}");
        assert_eq!(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(printable("line\nNEXT\r\t"), "line\\x0aNEXT\\x0d\\x09");
        assert_eq!(printable("del\x7f"), "del\\x7f");
        assert_eq!(printable("csi\u{9b}31m"), "csi\\u{9b}31m");
        assert_eq!(
            printable("back\\slash"),
            "back\\\\slash",
            "escapes stay unambiguous"
        );
        assert_eq!(printable("nul\0"), "nul\\x00");
    }

    fn args(store_url: &str, command: FilesCommand) -> FilesArgs {
        FilesArgs {
            command,
            store: FilesStoreArgs {
                store_url: Some(store_url.to_string()),
                store_options: Default::default(),
            },
            cluster: ClusterArgs {
                namespace: Some("ns".into()),
                ..Default::default()
            },
            uid: None,
            attempt: None,
            checkpoint: None,
        }
    }

    /// config/samples/batch-run.yaml's header names the directory `files get` writes its first
    /// path to (`<output>/<index>-<slug>/`).
    #[test]
    fn the_batch_sample_names_the_directory_files_get_writes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/samples/batch-run.yaml");
        let text = std::fs::read_to_string(path).expect("the sample");
        let run: crate::api::SandboxRun = serde_yaml::from_str(&text).expect("a SandboxRun");
        let first = &run.spec.read_back_paths()[0].path;
        let dir = format!("./out/{:02}-{}/", 0, crate::store::path_slug(first));
        let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
        assert!(
            header
                .iter()
                .any(|l| l.contains("files get") && l.contains(&dir)),
            "the header's `files get` line should name {dir}: {header:#?}"
        );
    }

    #[tokio::test]
    async fn ls_on_an_empty_file_store_says_the_operators_files_are_in_its_pod() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url::Url::from_directory_path(dir.path())
            .expect("url")
            .to_string();
        let mut out = Vec::new();
        let err = run_to(args(&url, FilesCommand::Ls { run: "job".into() }), &mut out)
            .await
            .expect_err("nothing is stored");
        let text = err.to_string();
        assert!(text.starts_with("nothing is stored for ns/job"), "{text}");
        assert!(text.contains("inside the operator's pod"), "{text}");
        assert!(text.contains(&url), "names the URL it read: {text}");

        // Any other store: the plain words.
        assert_eq!(file_store_hint("s3://runs/prod"), "");
        assert_eq!(file_store_hint("memory://"), "");
    }

    #[tokio::test]
    async fn files_never_panics_on_a_tampered_manifest_and_escapes_what_it_prints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url::Url::from_directory_path(dir.path())
            .expect("url")
            .to_string();
        let (store, _) = crate::store::store_from_url(&url, &[]).expect("file store");
        let mut m = stored_at(
            &store,
            &[
                ("a.txt", b'0', 0o644, b"aaa"),
                ("b.txt", b'0', 0o644, b"bbb"),
            ],
        )
        .await;
        // Non-ASCII where a hex sha belongs (a byte slice at 12 would split a character), a sha
        // of the wrong length, sizes and totals that contradict the lists, names that would
        // drive a terminal.
        m.members[0].sha256 = Some(format!("a{}", "\u{e9}".repeat(20)));
        m.members[0].path = "a.txt\x1b[2J".into();
        m.members[1].sha256 = Some("ab".into());
        m.members[1].size = u64::MAX;
        m.members[1].link_target = Some("\r\x1b]0;owned\x07".into());
        m.declared_path = "/out\nfake line".into();
        m.totals.members = 0;
        m.totals.dropped_members = 0;
        m.dropped.push(crate::store::DroppedRecord {
            path: "d\u{9b}31m".into(),
            size: u64::MAX,
            reason: "\x1b[31m".into(),
            in_pod: false,
        });
        m.pod_notes.push("note\x1b[1A".into());
        let key = object_store::path::Path::from("ns/job/u1/00-out.manifest.json");
        let json = serde_json::to_vec(&m).expect("json");
        store.put(&key, json.into()).await.expect("put manifest");

        let mut out = Vec::new();
        run_to(args(&url, FilesCommand::Ls { run: "job".into() }), &mut out)
            .await
            .expect("ls lists what it can");
        let text = String::from_utf8(out).expect("utf8");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("a.txt\\x1b[2J"), "{text}");
        assert!(text.contains("/out\\x0afake line"), "{text}");
        assert!(text.contains("\u{e9}\u{e9}"), "{text}");

        let target = dir.path().join("extracted");
        let got = run_to(
            args(
                &url,
                FilesCommand::Get {
                    run: "job".into(),
                    path: None,
                    output: target,
                },
            ),
            &mut Vec::new(),
        )
        .await;
        assert!(matches!(got, Err(FilesError::Verify(_))), "{got:?}");
    }

    /// A ustar entry appended to `t` (type, path, link target, content).
    fn entry(t: &mut Vec<u8>, ty: u8, path: &str, link: Option<&str>, data: &[u8]) {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::new(ty));
        h.set_path(path).expect("path");
        if let Some(l) = link {
            h.set_link_name(l).expect("link");
        }
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.extend_from_slice(h.as_bytes());
        t.extend_from_slice(data);
        t.resize(t.len().div_ceil(512) * 512, 0);
    }

    #[tokio::test]
    async fn files_get_neutralizes_a_member_that_folds_onto_a_symlink() {
        // Drained on Linux (case-sensitive): `LINK/x` is a path of its own. Extracted on macOS
        // or Windows it would be written through the symlink `Link` into `sub/`.
        let mut t = Vec::new();
        entry(&mut t, b'5', "sub/", None, b"");
        entry(&mut t, b'2', "Link", Some("sub"), b"");
        entry(&mut t, b'0', "LINK/x", None, b"through the link");
        entry(&mut t, b'0', "li\u{302}nk", None, b"not a fold of Link");
        entry(&mut t, b'0', "ok.txt", None, b"ok");
        t.extend_from_slice(&[0u8; 1024]);
        let (store, prefix) = crate::store::store_from_url("memory://", &[]).expect("store");
        let run = RunId {
            namespace: "ns".into(),
            name: "job".into(),
            uid: "u1".into(),
        };
        let keys = crate::store::object_keys(&prefix, &run, 0, "/out", Compression::None);
        let ctx = crate::store::ManifestContext {
            run,
            declared_path: "/out".into(),
            index: 0,
            attempt: 1,
        };
        let opts = crate::drain::DrainOptions::new(1 << 20, Compression::None);
        let (_, manifest) = crate::drain::drain_into_store(&t[..], &store, &keys, &opts, ctx)
            .await
            .expect("the drain keeps LINK/x");
        assert!(manifest.members.iter().any(|m| m.path == "LINK/x"));
        let out = tempfile::tempdir().expect("tempdir");
        let dir = out.path().join("x");
        let n = extract_verified(&store, &manifest, &dir)
            .await
            .expect("the rest of the path extracts");
        assert_eq!(n, manifest.members.len());
        assert!(!dir.join("LINK").exists(), "LINK/x is not written");
        assert!(!dir.join("sub/x").exists());
        assert!(std::fs::symlink_metadata(dir.join("Link"))
            .expect("Link")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(dir.join("ok.txt")).expect("ok.txt"), b"ok");
        assert!(dir.join("li\u{302}nk").is_file());
    }

    #[tokio::test]
    async fn files_get_never_follows_a_symlink_while_creating_directories() {
        // Someone (another process, or an earlier extraction) planted `d -> elsewhere` in the
        // output directory: `d/x` must not land in `elsewhere`.
        let (store, manifest) =
            stored(&[("d/", b'5', 0o755, b""), ("d/x", b'0', 0o644, b"x")]).await;
        let out = tempfile::tempdir().expect("tempdir");
        let elsewhere = out.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("elsewhere");
        let dir = out.path().join("x");
        std::fs::create_dir(&dir).expect("x");
        std::os::unix::fs::symlink(&elsewhere, dir.join("d")).expect("plant");
        let err = extract_verified(&store, &manifest, &dir)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("refusing to follow it"), "{err}");
        assert!(
            !elsewhere.join("x").exists(),
            "nothing written through the link"
        );
        // The same below a real directory: `a/b` planted as a link, `a/b/c/f` refused.
        let (store, manifest) = stored(&[("a/b/c/f", b'0', 0o644, b"f")]).await;
        let dir2 = out.path().join("y");
        std::fs::create_dir_all(dir2.join("a")).expect("a");
        std::os::unix::fs::symlink(&elsewhere, dir2.join("a/b")).expect("plant");
        let err = extract_verified(&store, &manifest, &dir2)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("refusing to follow it"), "{err}");
        assert!(!elsewhere.join("c").exists());
    }

    #[test]
    fn the_umask_is_read_from_proc_status() {
        let text = "Name:\tx\nUmask:\t0027\nState:\tR (running)\n";
        assert_eq!(umask_from_proc_status(text), Some(0o027));
        assert_eq!(umask_from_proc_status("Name:\tx\n"), None);
        assert_eq!(umask_from_proc_status("Umask:\tnope\n"), None);
    }

    #[tokio::test]
    async fn files_get_restores_private_modes_and_drops_setuid() {
        let (store, manifest) = stored(&[
            ("secret", b'0', 0o600, b"hunter2"),
            ("private/", b'5', 0o700, b""),
            ("private/key", b'0', 0o600, b"k"),
            ("tool", b'0', 0o4755, b"#!/bin/sh\n"),
            ("shared", b'0', 0o777, b"s"),
            // A read-only directory listed before its child: its mode comes last.
            ("ro/", b'5', 0o500, b""),
            ("ro/inside", b'0', 0o644, b"i"),
        ])
        .await;
        let out = tempfile::tempdir().expect("tempdir");
        let dir = out.path().join("x");
        let n = extract_verified(&store, &manifest, &dir)
            .await
            .expect("extract");
        assert_eq!(n, 7);
        let umask = process_umask(out.path()).await;
        assert_eq!(
            mode_of(&dir.join("secret")),
            0o600,
            "a 0600 secret stays 0600"
        );
        assert_eq!(
            mode_of(&dir.join("private")),
            0o700,
            "a 0700 dir stays 0700"
        );
        assert_eq!(mode_of(&dir.join("private/key")), 0o600);
        let tool = mode_of(&dir.join("tool"));
        assert_eq!(tool & 0o7000, 0, "setuid is never restored: {tool:o}");
        assert_eq!(tool, 0o755 & !umask, "{tool:o}");
        assert_eq!(mode_of(&dir.join("shared")), 0o777 & !umask);
        assert_eq!(mode_of(&dir.join("ro")), 0o500 & !umask);
        assert_eq!(std::fs::read(dir.join("ro/inside")).expect("child"), b"i");
        // Let the tempdir be removed (a 0500 directory blocks it for a non-root user).
        std::fs::set_permissions(dir.join("ro"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod back");
    }
}
