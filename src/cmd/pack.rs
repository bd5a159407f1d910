//! `sandboxrun-operator pack`: exec'd in the holder by the drain (`crate::inpod::pack`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Arguments of `pack`.
#[derive(Args, Debug)]
pub struct PackArgs {
    /// Directory to archive.
    pub path: PathBuf,
    /// The path's cap in bytes: a file that would take the packed total over it is written as a
    /// zero-length placeholder carrying the PAX record `SANDBOXRUN.dropped=<size>` (its content
    /// never crosses the wire). Without it every file is packed whole.
    #[arg(long, value_name = "BYTES")]
    pub budget: Option<u64>,
}

/// Runs `pack`: the tar of `args.path` on stdout, notes on stderr.
pub fn main(args: PackArgs) -> ExitCode {
    let stdout = std::io::stdout().lock();
    let stderr = std::io::stderr();
    match crate::inpod::pack::pack(
        &args.path,
        args.budget,
        std::io::BufWriter::with_capacity(256 * 1024, stdout),
        stderr,
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxrun-operator pack: {e}");
            ExitCode::from(1)
        }
    }
}
