//! Operator-side memory of the drain against streams written to make it hold as much as possible
//! (docs/performance.md, "Drain memory"): the real host-side pipeline — parser, sanitizer, cap and
//! metadata meters, re-emitted archive, multipart writer into a `file://` store, manifest commit
//! (`drain::drain_into_store`) — fed in-process by a generated tar stream.
//!
//! ```text
//! drain_memory flood [FILES] [CAP_BYTES]     FILES empty files with 4 KiB names (default 1,000,000;
//!                                            cap 16 GiB, so the whole stream is within the input bound)
//! drain_memory symlinks [COUNT] [CAP_BYTES]  symlinks with 3.9 KiB names (15 nested 255-byte
//!                                            directories; issue #25 item 1), default cap 1 GiB
//! drain_memory dirs [COUNT] [CAP_BYTES]      directories with 4 KiB names, default cap 1 GiB
//! drain_memory dropped [COUNT] [CAP_BYTES]   placeholders of files the packer dropped in the pod
//!                                            (`SANDBOXRUN.dropped`), 4 KiB names, default cap 1 GiB
//! drain_memory rejected [COUNT] [CAP_BYTES]  files with 8 KiB names (rejected `path_too_long`),
//!                                            default cap 1 GiB
//! drain_memory long-name                     one GNU `L` header announcing a 2 GiB body, then zeros
//! drain_memory emit KIND [COUNT]              the stream of KIND on stdout instead (a packer stand-in
//!                                            for the real operator: bench/drain_floods.sh)
//! ```
//!
//! Prints what was stored and the process's VmRSS / VmHWM (from /proc/self/status); run it under
//! `/usr/bin/time -v` for the peak as the kernel saw it (bench/drain_memory.sh does both). Numbers
//! are printed, never asserted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use object_store::ObjectStore;
use sandboxrun_operator::api::Compression;
use sandboxrun_operator::drain::{drain_into_store, DrainOptions};
use sandboxrun_operator::identity::RunId;
use sandboxrun_operator::store::{object_keys, store_from_url, ManifestContext};
use tokio::io::{AsyncRead, ReadBuf};

const NAME_BYTES: usize = 4096;

/// A tar stream produced entry by entry, never held whole.
struct Generated {
    next: u64,
    count: u64,
    buf: Vec<u8>,
    pos: usize,
    mode: Mode,
    ended: bool,
}

#[derive(Clone, Copy)]
enum Mode {
    /// `count` entries of one kind with long names (a PAX `path` record each).
    Flood(Kind),
    /// One `L` header announcing 2 GiB, then zeros for as long as anyone reads.
    LongName,
}

/// What a flood is made of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Empty files, [`NAME_BYTES`]-byte names.
    File,
    /// Symlinks to `t`, 3.9 KiB names of 15 nested 255-byte directories.
    Symlink,
    /// Directories, [`NAME_BYTES`]-byte names.
    Dir,
    /// Placeholders of files dropped in the pod (`SANDBOXRUN.dropped=4096`), [`NAME_BYTES`]-byte names.
    Dropped,
    /// Empty files with 8 KiB names: rejected (`path_too_long`).
    Rejected,
}

/// Path of the `i`th entry of a `kind` flood, unique by `i`.
fn flood_name(kind: Kind, i: u64) -> String {
    match kind {
        Kind::Symlink => {
            let mut name = vec!["s".repeat(255); 15].join("/");
            name.push_str(&format!("/l{i:08}"));
            name
        }
        Kind::Rejected => format!("{}/{}", long_name(i), long_name(i)),
        _ => long_name(i),
    }
}

fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

fn header(ty: u8, name: &str, size: u64) -> [u8; 512] {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::new(ty));
    h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    *h.as_bytes()
}

/// A 4 KiB path of 250-byte components, unique by `i`.
fn long_name(i: u64) -> String {
    let tail = format!("/f{i:08}");
    let mut name = String::new();
    while name.len() + 251 + tail.len() <= NAME_BYTES {
        if !name.is_empty() {
            name.push('/');
        }
        name.push_str(&"d".repeat(250));
    }
    name.push_str(&tail);
    name.push_str(&"n".repeat(NAME_BYTES - name.len()));
    name
}

impl Generated {
    fn refill(&mut self) {
        self.buf.clear();
        self.pos = 0;
        match self.mode {
            Mode::Flood(kind) if self.next < self.count => {
                let mut records = pax_record("path", &flood_name(kind, self.next));
                if kind == Kind::Dropped {
                    records.extend_from_slice(&pax_record("SANDBOXRUN.dropped", "4096"));
                }
                self.buf
                    .extend_from_slice(&header(b'x', "PaxHeader", records.len() as u64));
                self.buf.extend_from_slice(&records);
                self.buf.resize(self.buf.len().div_ceil(512) * 512, 0);
                let (ty, link) = match kind {
                    Kind::Symlink => (b'2', Some("t")),
                    Kind::Dir => (b'5', None),
                    _ => (b'0', None),
                };
                let mut block = header(ty, &format!("f{}", self.next), 0);
                if let Some(link) = link {
                    block[157..157 + link.len()].copy_from_slice(link.as_bytes());
                    let mut h = tar::Header::from_byte_slice(&block).clone();
                    h.set_cksum();
                    block = *h.as_bytes();
                }
                self.buf.extend_from_slice(&block);
                self.next += 1;
            }
            Mode::Flood(_) if !self.ended => {
                self.buf.extend_from_slice(&[0u8; 1024]);
                self.ended = true;
            }
            Mode::Flood(_) => {}
            Mode::LongName if self.next == 0 => {
                self.buf
                    .extend_from_slice(&header(b'L', "././@LongLink", 2 << 30));
                self.next = 1;
            }
            Mode::LongName => self.buf.resize(64 * 1024, 0),
        }
    }
}

impl AsyncRead for Generated {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos == self.buf.len() {
            self.refill();
        }
        let this = &mut *self;
        let n = (this.buf.len() - this.pos).min(out.remaining());
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// (VmRSS, VmHWM) in KiB.
fn rss() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `emit KIND [COUNT]`: the same stream on stdout, for a packer stand-in (bench/drain_floods.sh).
    let emit = args.first().is_some_and(|a| a == "emit");
    if emit {
        args.remove(0);
    }
    let kind = match args.first().map(String::as_str) {
        Some("flood") => Some(Kind::File),
        Some("symlinks") => Some(Kind::Symlink),
        Some("dirs") => Some(Kind::Dir),
        Some("dropped") => Some(Kind::Dropped),
        Some("rejected") => Some(Kind::Rejected),
        Some("long-name") => None,
        _ => return Err("usage: drain_memory [emit] flood|symlinks|dirs|dropped|rejected [COUNT] [CAP_BYTES] | long-name".into()),
    };
    let default_cap = if kind == Some(Kind::File) {
        16u64 << 30
    } else {
        1 << 30
    };
    let (mode, count, cap) = match kind {
        Some(kind) => (
            Mode::Flood(kind),
            args.get(1).map_or(Ok(1_000_000), |a| a.parse())?,
            args.get(2).map_or(Ok(default_cap), |a| a.parse())?,
        ),
        None => (Mode::LongName, 0, 16u64 << 30),
    };
    let mut input = Generated {
        next: 0,
        count,
        buf: Vec::new(),
        pos: 0,
        mode,
        ended: false,
    };
    if emit {
        tokio::io::copy(&mut input, &mut tokio::io::stdout()).await?;
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let url = url::Url::from_directory_path(dir.path())
        .map_err(|()| "tempdir url")?
        .to_string();
    let (store, prefix): (Arc<dyn ObjectStore>, _) = store_from_url(&url, &[])?;
    let run = RunId {
        namespace: "bench".into(),
        name: "memory".into(),
        uid: "u".into(),
    };
    let keys = object_keys(&prefix, &run, 0, "/out", Compression::None);
    let ctx = ManifestContext {
        run,
        declared_path: "/out".into(),
        index: 0,
        attempt: 1,
    };
    let opts = DrainOptions::new(cap, Compression::None);
    let before = rss();
    let started = std::time::Instant::now();
    let result = drain_into_store(input, &store, &keys, &opts, ctx).await;
    let secs = started.elapsed().as_secs_f64();
    let after = rss();
    match result {
        Ok((outcome, manifest)) => {
            let manifest_bytes = std::fs::metadata(dir.path().join(keys.manifest.as_ref()))
                .map(|m| m.len())
                .unwrap_or(0);
            println!(
                "drained in {secs:.1} s: phase {:?}, {} input bytes, {} members kept, {} dropped ({} listed), {} rejected; archive {} bytes, manifest {} bytes",
                manifest.phase,
                outcome.input_bytes,
                manifest.totals.members,
                manifest.totals.dropped_members,
                manifest.dropped.len(),
                manifest.totals.rejected_members,
                manifest.totals.archive_bytes,
                manifest_bytes,
            );
        }
        Err(e) => println!("refused in {secs:.3} s: {e}"),
    }
    println!(
        "VmRSS before {} KiB, after {} KiB; VmHWM before {} KiB, after {} KiB",
        before.0, after.0, before.1, after.1
    );
    Ok(())
}
