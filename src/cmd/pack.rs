//! `sandboxrun-operator pack`: exec'd in the holder by the drain (`crate::inpod::pack`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::drain::wire::{adaptive_writer, zstd_writer, Wire};

/// Arguments of `pack`.
#[derive(Args, Debug)]
pub(crate) struct PackArgs {
    /// Directory to archive.
    pub(crate) path: PathBuf,
    /// The path's cap in bytes: a file that would take the packed total over it is written as a
    /// zero-length placeholder carrying the PAX record `SANDBOXRUN.dropped=<size>` (its content
    /// never crosses the wire). Without it every file is packed whole.
    #[arg(long, value_name = "BYTES")]
    pub(crate) budget: Option<u64>,
    /// How the tar crosses the exec stream: as is, in one zstd frame, or adaptive (blocks
    /// compressed or stored, whichever is smaller); the drain decodes it before sanitizing
    /// (docs/contract.md "The stream on the wire").
    #[arg(long, value_enum, default_value = "tar")]
    pub(crate) wire: Wire,
}

/// Runs `pack`: the tar of `args.path` on stdout, notes on stderr.
pub(crate) fn main(args: PackArgs) -> ExitCode {
    let stdout = std::io::BufWriter::with_capacity(256 * 1024, std::io::stdout().lock());
    let stderr = std::io::stderr();
    let packed = match args.wire {
        Wire::Tar => crate::inpod::pack::pack(&args.path, args.budget, stdout, stderr)
            .map(|_| ())
            .map_err(PackFailed::Pack),
        Wire::Zstd => zstd_pack(&args, stdout, stderr),
        Wire::Adaptive => adaptive_pack(&args, stdout, stderr),
    };
    match packed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxrun-operator pack: {e}");
            ExitCode::from(1)
        }
    }
}

/// The tar in one zstd frame, finished and flushed (an unfinished frame reads as truncated).
fn zstd_pack(
    args: &PackArgs,
    stdout: impl std::io::Write,
    stderr: impl std::io::Write,
) -> Result<(), PackFailed> {
    let mut encoder = zstd_writer(stdout).map_err(PackFailed::Zstd)?;
    crate::inpod::pack::pack(&args.path, args.budget, &mut encoder, stderr)?;
    let mut stdout = encoder.finish().map_err(PackFailed::Zstd)?;
    stdout.flush().map_err(PackFailed::Flush)
}

/// The tar on the adaptive wire, its end frame written and flushed (a stream without it reads
/// as cut).
fn adaptive_pack(
    args: &PackArgs,
    stdout: impl std::io::Write,
    stderr: impl std::io::Write,
) -> Result<(), PackFailed> {
    let mut writer = adaptive_writer(stdout).map_err(PackFailed::Wire)?;
    crate::inpod::pack::pack(&args.path, args.budget, &mut writer, stderr)?;
    let mut stdout = writer.finish().map_err(PackFailed::Wire)?;
    stdout.flush().map_err(PackFailed::Flush)
}

/// Why `pack` wrote no whole archive (its stderr, after "sandboxrun-operator pack: ").
#[derive(Debug, thiserror::Error)]
enum PackFailed {
    #[error("{0}")]
    Pack(#[from] crate::inpod::pack::PackError),
    #[error("zstd: {0}")]
    Zstd(std::io::Error),
    #[error("adaptive wire: {0}")]
    Wire(std::io::Error),
    #[error("{0}")]
    Flush(std::io::Error),
}
