//! `sandboxrun-operator files ls|get` (`crate::files`): its exit codes and the hint printed when
//! the store refuses the reader's credentials.

use std::process::ExitCode;

use crate::files::{resolve, run_at, FilesArgs, FilesError};

/// Runs `files`.
pub(crate) async fn main(args: FilesArgs) -> ExitCode {
    let mut out = std::io::stdout();
    let result = match resolve(&args).await {
        Ok(target) => run_at(args, &target, &mut out)
            .await
            .map_err(|e| (e, Some(target.store_url))),
        Err(e) => Err((e, None)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((FilesError::Usage(m), _)) => {
            eprintln!("{m}");
            ExitCode::from(2)
        }
        Err((e, store_url)) => {
            eprintln!("files: {e}");
            if let (FilesError::Store(store_error), Some(url)) = (&e, store_url) {
                if store_error.is_refused() {
                    eprintln!(
                        "files: {}",
                        crate::store::credentials::reader_refused_hint(&url)
                    );
                }
            }
            ExitCode::from(1)
        }
    }
}
