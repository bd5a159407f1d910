//! `sandboxrun-operator crd`: the SandboxRun CustomResourceDefinition as YAML.

use std::process::ExitCode;

/// Prints the CRD.
pub(crate) fn main() -> ExitCode {
    match crate::crdgen::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot render the CRD: {e}");
            ExitCode::from(1)
        }
    }
}
