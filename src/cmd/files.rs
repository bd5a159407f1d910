//! `sandboxrun-operator files ls|get` (`crate::files`): its exit codes and the hint printed when
//! the store refuses the reader's credentials.

use std::process::ExitCode;

use crate::files::{run_to, FilesArgs, FilesError};

/// Runs `files`.
pub async fn main(args: FilesArgs) -> ExitCode {
    let mut out = std::io::stdout();
    let store_url = args.store.store_url.clone();
    match run_to(args, &mut out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(FilesError::Usage(m)) => {
            eprintln!("{m}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("files: {e}");
            if let FilesError::Store(store_error) = &e {
                if crate::store::credentials::store_is_refused(store_error) {
                    eprintln!(
                        "files: {}",
                        crate::store::credentials::reader_refused_hint(&store_url)
                    );
                }
            }
            ExitCode::from(1)
        }
    }
}
